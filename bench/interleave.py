"""Trinity's proxy and bare vLLM on one GPU at the same time, their loads interleaved (GPU host).

Every long run so far started bare ``vllm serve``, loaded it for minutes, stopped it, then did the same with
``rftstack serve`` (or the other way round), and from one such run to the next on one machine bare itself moved by up
to 19 % (docs/benchmarks.md section 1, session AN). Here both servers are up together, each given ``--gpu-util`` of the
GPU's memory, and the load goes to one at a time: at each level (c=32 and c=64, equal lengths and with ``--spread``
spread lengths, loadgen's requests as in the long runs) one path, then the next, ``--rounds`` times, the paths' order
turned by one each round (A B, B A, A B, ...). What drifts with time (the GPU's clocks and heat, the host's other
work, the compile cache) then falls on both alike, and each round gives one ratio measured seconds apart.

Paths: ``trinity`` (through Trinity's proxy, plain requests, as users call it), ``bare`` (``vllm serve`` as it comes),
with ``--engine-direct`` ``engine`` (the proxy's own request straight to Trinity's engine: serve_vs_bare.py's
``engine_direct_request``), with ``--bare-fields`` ``bare-fields`` (that request to bare: what the fields cost bare
itself), one ``bare:ARGS`` path per ``--bare-variants`` entry (``vllm serve`` with those arguments, started beside
the others), one ``hop`` path per ``--hops`` entry (bench/hop.py in front of Trinity's engine, a forwarding hop
that keeps no experience: ``none`` as it is, ``wait=MS`` holding each answer, ``busy=MS`` keeping its loop busy for each
answer, ``group=MS`` releasing the answers in groups as a group commit does (each commit a sleep), ``store=disk|shm``
committing each answer to an SQLite file; which of these the engine's steps feel, where the
proxy's do), and one ``proxy:VARIANT`` path per ``--proxies`` variant (Trinity's proxy app and recorder as
bench/proxy_overhead.py runs them, in a plain process in front of Trinity's engine: the proxy outside the Explorer
actor, with or without its recording). ``--db-url`` puts the serve's own store elsewhere (e.g. on /dev/shm). Every level records the machine's CPU and steal, how busy the GPU was
(bench/gpu_busy.py) and, where the server keeps vLLM's statistics, the engine's own account (bench/engine_metrics.py;
the serve's with ``RFTSTACK_ENGINE_LOG_STATS=1``).

    python3 bench/interleave.py --model /tmp/bench/qwen3b --out /tmp/gs/bench/interleave-qwen3b.json \\
        [--rounds 4] [--requests-per-client 16] [--spread 0.75] [--gpu-util 0.4] [--engine-direct]
    python3 bench/interleave.py --table RESULT.json      # the figures as a Markdown table (docs/benchmarks.md)
    python3 bench/interleave.py --table RESULT.json --steps   # the engine's step rate, the GPU's busy and idle ms a step
    python3 bench/interleave.py --table RESULT.json --latency # a request's time outside the engine and in its phases

Writes the JSON after every level, and each server's log next to it. Everything it started is stopped at the end,
on an error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import engine_metrics  # noqa: E402
import gpu_busy  # noqa: E402
import loadgen  # noqa: E402
import serve_profile as sp  # noqa: E402
import serve_vs_bare as svb  # noqa: E402

REFERENCE = "bare"  # the path every other path's figures are measured against


@dataclass
class LoadPath:
    """One way to send the load: its name, the server's base URL, the request (loadgen's ``like_proxy``), the model
    name to ask for and, where its engine keeps vLLM's statistics, that engine's base URL."""

    name: str
    url: str
    request: bool | str
    model: str
    metrics_url: str | None = None


def level_specs(levels: list[int], spread_levels: list[int], spread: float) -> list[tuple[str, int, float]]:
    """(key, concurrency, spread) of every level a round runs: the equal lengths first, then the spread ones."""
    specs = [(f"c={c} equal", c, 0.0) for c in levels]
    if spread:
        specs += [(f"c={c} spread", c, spread) for c in spread_levels]
    return specs


def order_for(names: list[str], round_no: int) -> list[str]:
    """The paths' order in round ``round_no`` (1-based): turned by one each round, so that with two paths every
    other round starts with the other, and with more each path leads in turn."""
    k = (round_no - 1) % len(names)
    return names[k:] + names[:k]


def engine_account(url: str | None, before: dict | None, wall_s: float) -> dict | None:
    """The engine's own account of a level from two scrapes of its /metrics, or one phrase why there is none."""
    if not url or before is None:
        return None
    try:
        return engine_metrics.window(before, engine_metrics.scrape(url), wall_s)
    except Exception as e:  # the server went away mid-level: the level's own error counts say so
        return {"error": f"/metrics unreadable after the level: {type(e).__name__}: {e}"}


def run_level(path: LoadPath, c: int, spread: float, requests: int, args) -> dict:
    """One level of loadgen's closed loop against ``path`` (with the GPU's busy share), and its engine's account."""
    before = None
    if path.metrics_url:
        try:
            before = engine_metrics.scrape(path.metrics_url)
        except Exception:
            before = None
    t0 = time.monotonic()
    res = asyncio.run(loadgen.run(
        path.url, levels=[c], requests=requests, max_tokens=args.max_tokens, model=path.model,
        label=f"{path.name} c={c}", like_proxy=path.request, level_timeout_s=args.level_timeout,
        request_timeout_s=min(120.0, args.level_timeout), spread=spread, gpu=True))
    level = res["levels"][0]
    eng = engine_account(path.metrics_url, before, time.monotonic() - t0)
    if eng is not None:
        level["engine"] = eng
    return level


def run_rounds(paths: list[LoadPath], args, result: dict, save, say) -> None:
    """``args.rounds`` rounds of every level, each level's paths back to back in the round's order; the levels
    under ``result["rounds"]`` as ``[{key: {path: loadgen level}}]``, saved after each."""
    specs = level_specs(args.levels, args.spread_levels, args.spread)
    names = [p.name for p in paths]
    by_name = {p.name: p for p in paths}
    result["paths"] = {p.name: {"url": p.url, "request": p.request, "model": p.model, "engine_stats": bool(p.metrics_url)}
                       for p in paths}
    result["levels"] = [{"key": k, "concurrency": c, "spread": s} for k, c, s in specs]
    result["rounds"] = []
    for round_no in range(1, args.rounds + 1):
        order = order_for(names, round_no)
        got: dict = {"order": order, "levels": {}}
        result["rounds"].append(got)
        for key, c, spread in specs:
            lv = got["levels"][key] = {}
            for name in order:
                lv[name] = run_level(by_name[name], c, spread, args.requests_per_client * c, args)
                say(f"round {round_no} {key} {name}: {lv[name]['output_tokens_per_s']} tok/s, p99 "
                    f"{lv[name]['latency_s']['p99']} s, {lv[name]['ok']}/{lv[name]['requests']} ok"
                    + (f", {gpu_busy.line(lv[name]['gpu'])}" if "gpu" in lv[name] else ""))
                save()


class Missing(ValueError):
    """A result file without the figures asked of it (one sentence: which, and where)."""


def figures(result: dict) -> dict:
    """Per level key and per path other than bare: each round's throughput ratio (output tokens/s over bare's in the
    same round), their range, the pooled ratio (the path's tokens over every round against bare's, each over its own
    wall time summed) and each round's p99 ratio."""
    rounds = result.get("rounds") or []
    done = [r for r in rounds if all(REFERENCE in lv for lv in r.get("levels", {}).values())]
    if not done:
        raise Missing("the result holds no round with a bare level; was the run stopped before its first round?")
    out: dict = {}
    paths = [n for n in result["paths"] if n != REFERENCE]
    for spec in result["levels"]:
        key = spec["key"]
        out[key] = {}
        for name in paths:
            pairs = [(r["levels"][key][name], r["levels"][key][REFERENCE]) for r in done
                     if name in r["levels"].get(key, {})]
            pairs = [(a, b) for a, b in pairs if a["ok"] == a["requests"] and b["ok"] == b["requests"]]
            if not pairs:
                continue
            ratios = [a["output_tokens_per_s"] / b["output_tokens_per_s"] for a, b in pairs]
            p99 = [a["latency_s"]["p99"] / b["latency_s"]["p99"] for a, b in pairs]
            tok = lambda lvs: sum(x["output_tokens"] for x in lvs) / sum(x["wall_s"] for x in lvs)  # noqa: E731
            out[key][name] = {"rounds": ratios, "min": min(ratios), "max": max(ratios),
                              "pooled": tok([a for a, _ in pairs]) / tok([b for _, b in pairs]),
                              "p99_rounds": p99, "bare_tok_s": [b["output_tokens_per_s"] for _, b in pairs]}
    return out


def markdown_head(head: list[str]) -> list[str]:
    """A Markdown table's header line and its rule."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def path_levels(result: dict, keep) -> list[tuple[str, str, list[dict]]]:
    """(level key, path, that path's level in every round where ``keep(level)`` holds) for every level and path of
    ``result`` that has at least one such round."""
    out = []
    for spec in result.get("levels", []):
        key = spec["key"]
        for name in result.get("paths", {}):
            lvs = [r["levels"][key][name] for r in result.get("rounds", []) if name in r.get("levels", {}).get(key, {})]
            lvs = [x for x in lvs if keep(x)]
            if lvs:
                out.append((key, name, lvs))
    return out


def table(result: dict) -> str:
    """The figures as Markdown: one row per level and path, each round's ratio, the range, pooled, and the p99
    ratios; bare's own tokens/s from round to round beside them (what drift the interleaving took out)."""
    figs = figures(result)
    n = max(len(v["rounds"]) for lv in figs.values() for v in lv.values())
    head = ["level", "path", *(f"round {i}" for i in range(1, n + 1)), "range", "pooled", "p99 ratio (range)",
            "bare tok/s (range)"]
    rows = markdown_head(head)
    for key, per in figs.items():
        for name, f in per.items():
            cells = [f"{x:.2f}" for x in f["rounds"]] + ["-"] * (n - len(f["rounds"]))
            rows.append("| " + " | ".join([key, name, *cells, f"{f['min']:.2f}-{f['max']:.2f}", f"{f['pooled']:.2f}",
                                           f"{min(f['p99_rounds']):.2f}-{max(f['p99_rounds']):.2f}",
                                           f"{min(f['bare_tok_s']):.0f}-{max(f['bare_tok_s']):.0f}"]) + " |")
    return "\n".join(rows)


def steps(result: dict) -> dict:
    """Per level key and path, the means over the rounds whose level has the engine's account and the GPU's busy
    share: the engine's steps a second and tokens a step, the GPU's busy share, the time a step takes (1000 over the
    step rate, ms), how much of it the GPU was busy (the busy share of it) and idle, and the machine's busy cores.
    The same GPU-busy ms a step on two paths and more idle ms says the slower path loses host time between steps,
    not GPU work."""
    import statistics

    out: dict = {}
    measured = lambda x: isinstance(x.get("engine"), dict) and x["engine"].get("steps_per_s") and "busy_pct" in x.get("gpu", {})  # noqa: E731
    for key, name, lvs in path_levels(result, measured):
        sps = statistics.fmean(x["engine"]["steps_per_s"] for x in lvs)
        busy = statistics.fmean(x["gpu"]["busy_pct"] for x in lvs)
        step_ms = 1000 / sps
        out.setdefault(key, {})[name] = {
            "rounds": len(lvs), "steps_per_s": sps, "tokens_per_step": statistics.fmean(x["engine"]["tokens_per_step"] for x in lvs),
            "gpu_busy_pct": busy, "step_ms": step_ms, "gpu_busy_ms_per_step": busy / 100 * step_ms,
            "gpu_idle_ms_per_step": (1 - busy / 100) * step_ms,
            "busy_cores": statistics.fmean(x["machine"]["busy_cores"] for x in lvs if "machine" in x) if any("machine" in x for x in lvs) else None}
    if not out:
        raise Missing("no level holds both the engine's account and the GPU's busy share (a GPU host's run with "
                      "RFTSTACK_ENGINE_LOG_STATS=1 records them)")
    return out


def latency(result: dict) -> dict:
    """Per level key and path, means over the rounds whose level has the engine's account with its request times:
    the client's mean latency, the engine's mean end-to-end time of a request (vLLM's e2e_request_latency: from its
    frontend's arrival to the last token) and their difference, the time a request spends outside the engine (HTTP,
    the client, any proxy or hop), and the engine's queue, prefill and decode times (ms)."""
    import statistics

    out: dict = {}
    timed = lambda x: (isinstance((x.get("engine") or {}).get("mean_s"), dict)  # noqa: E731
                       and x["engine"]["mean_s"].get("e2e_request_latency") is not None and x.get("ok") == x.get("requests"))
    for key, name, lvs in path_levels(result, timed):
        def ms(f, lvs=lvs) -> float:
            return 1000 * statistics.fmean(f(x) for x in lvs)
        out.setdefault(key, {})[name] = {
            "rounds": len(lvs), "client_ms": ms(lambda x: x["latency_s"]["mean"]),
            "engine_ms": ms(lambda x: x["engine"]["mean_s"]["e2e_request_latency"]),
            "outside_ms": ms(lambda x: x["latency_s"]["mean"] - x["engine"]["mean_s"]["e2e_request_latency"]),
            **{f"{k}_ms": ms(lambda x, k=k: x["engine"]["mean_s"][f"request_{k}_time"])
               for k in ("queue", "prefill", "decode")}}
    if not out:
        raise Missing("no level holds the engine's request times (a GPU host's run with RFTSTACK_ENGINE_LOG_STATS=1 "
                      "records them)")
    return out


def latency_table(result: dict) -> str:
    """:func:`latency` as Markdown, a row per level and path."""
    head = ["level", "path", "rounds", "client ms", "engine e2e ms", "outside the engine ms", "queue ms", "prefill ms",
            "decode ms"]
    rows = markdown_head(head)
    for key, per in latency(result).items():
        for name, f in per.items():
            rows.append(f"| {key} | {name} | {f['rounds']} | {f['client_ms']:.1f} | {f['engine_ms']:.1f} | "
                        f"{f['outside_ms']:.1f} | {f['queue_ms']:.1f} | {f['prefill_ms']:.1f} | {f['decode_ms']:.1f} |")
    return "\n".join(rows)


def steps_table(result: dict) -> str:
    """:func:`steps` as Markdown, a row per level and path."""
    head = ["level", "path", "rounds", "engine steps/s", "tokens a step", "GPU busy %", "ms a step", "GPU-busy ms a step",
            "GPU-idle ms a step", "host busy cores"]
    rows = markdown_head(head)
    for key, per in steps(result).items():
        for name, f in per.items():
            cores = "-" if f["busy_cores"] is None else f"{f['busy_cores']:.2f}"
            rows.append(f"| {key} | {name} | {f['rounds']} | {f['steps_per_s']:.1f} | {f['tokens_per_step']:.1f} | "
                        f"{f['gpu_busy_pct']:.1f} | {f['step_ms']:.2f} | {f['gpu_busy_ms_per_step']:.2f} | "
                        f"{f['gpu_idle_ms_per_step']:.2f} | {cores} |")
    return "\n".join(rows)


def wait_ready(name: str, base: str, proc: svb.Proc, ph: dict, args) -> str:
    """The model name ``proc``'s server at ``base`` answers with once ready (its readiness under ``ph["ready"]``); a
    server not ready in ``--ready-timeout`` leaves its log's tail in ``ph`` and raises one sentence naming it and its log."""
    ph["ready"] = svb.wait_ready(base, proc, time.monotonic() + args.ready_timeout)
    if not ph["ready"]["ready"]:
        ph["log_tail"] = proc.tail(40)
        raise RuntimeError(f"{name} was not ready ({ph['ready'].get('error')}); its log: {proc.log}")
    return ph["ready"]["model"]


def start_serve(args, out: Path, stack: ExitStack, result: dict, say) -> list[LoadPath]:
    """`rftstack serve` of the report's config at ``--gpu-util``; its paths (through the proxy, and with
    ``--engine-direct`` its engine directly). Stopped, with its Ray, when ``stack`` closes."""
    work, port, cfg = sp.serve_config(args, out)
    env = sp.child_env()
    before = svb.listening_ports()
    proc = svb.Proc([sys.executable, "-m", "rftstack", "serve", "-c", str(cfg), "--run-dir", str(work / "run"),
                     *args.serve_args.split()], out.parent / f"{out.stem}-serve.log", env)
    ph = result.setdefault("servers", {})["trinity"] = {"config": str(cfg), "db_url": getattr(args, "db_url", None)}

    def stop() -> None:
        ph["stop"] = proc.stop(grace_s=30)
        ph["ray_stop"] = svb.ray_stop_force()
    stack.callback(stop)
    base = f"http://127.0.0.1:{port}"
    model = wait_ready("rftstack serve", base, proc, ph, args)
    engines = svb.find_openai_servers(svb.listening_ports() - before, exclude={port})
    stats = engines[0] if engines and engine_metrics.keeps_stats(engines[0]) else None
    ph["engine_urls"], ph["engine_stats"] = engines, bool(stats)
    say(f"rftstack serve ready in {ph['ready']['first_answer_s']} s; its engine's statistics "
        f"{'on' if stats else 'off (RFTSTACK_ENGINE_LOG_STATS=1 keeps them)'}")
    paths = [LoadPath("trinity", base, False, model, stats)]
    if args.engine_direct:
        if not engines:
            raise RuntimeError("--engine-direct: no OpenAI server of Trinity's engine was found on loopback")
        paths.append(LoadPath("engine", engines[0], svb.engine_direct_request(env), model, stats))
    return paths


def start_bare(args, out: Path, stack: ExitStack, result: dict, say, variant: str) -> LoadPath:
    """Bare `vllm serve` (with ``variant``'s arguments) at ``--gpu-util``; stopped when ``stack`` closes."""
    words = sp.bare_args(variant)
    name = REFERENCE if not words else f"bare:{' '.join(words)}"
    port = svb.free_port()
    _, argv, env_extra = sp.bare_argv(args.model, port, args.gpu_util, args.max_model_len, words)
    _, suffix = sp.variant_names(words)
    proc = svb.Proc(argv, out.parent / f"{out.stem}-bare{'-' + suffix if suffix else ''}.log",
                    {**sp.child_env(), **env_extra})
    ph = result.setdefault("servers", {})[name] = {"argv": argv, "env": env_extra}
    stack.callback(lambda: ph.__setitem__("stop", proc.stop(grace_s=20)))
    base = f"http://127.0.0.1:{port}"
    model = wait_ready(name, base, proc, ph, args)
    say(f"{name} ready in {ph['ready']['first_answer_s']} s")
    return LoadPath(name, base, False, model, base)


def proxy_metrics(base: str) -> dict:
    """Trinity's proxy's own counts (its /metrics: requests answered, experiences recorded), or one phrase why not:
    every answer through the proxy must have become an experience."""
    try:
        return svb.http_json(base + "/metrics", timeout=5)[1]
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


STORES = {"disk": None, "shm": Path("/dev/shm")}  # store=disk: next to the result; shm: on tmpfs


def hop_spec(entry: str, out: Path = Path("interleave.json")) -> tuple[str, list[str]]:
    """A ``--hops`` entry as its path's name and bench/hop.py's arguments: ``none`` -> ``hop``; ``wait=10,busy=2``
    -> ``hop:wait=10,busy=2`` with ``--wait-ms 10 --busy-ms 2``; ``store=disk`` (``shm``) commits each answer to an
    SQLite file next to ``out`` (on /dev/shm). A bad entry raises ValueError with one phrase."""
    entry = entry.strip()
    if entry == "none":
        return "hop", []
    name = f"hop:{entry}"
    argv: list[str] = []
    for part in entry.split(","):
        key, eq, value = part.strip().partition("=")
        if key == "store" and eq:
            if value not in STORES:
                raise ValueError(f"--hops entry {entry!r}: store= takes disk (a file next to the result) or shm (/dev/shm)")
            where = STORES[value] or out.parent
            argv += ["--store", str(where / f"{out.stem}-{hop_suffix(name)}.db")]
            continue
        if key not in ("wait", "busy", "group") or not eq:
            raise ValueError(f"--hops entry {entry!r}: give none, or wait=MS, busy=MS, group=MS and/or store=disk|shm "
                             "joined by a comma")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--hops entry {entry!r}: {value!r} is not a number of milliseconds") from None
        if ms < 0:
            raise ValueError(f"--hops entry {entry!r}: milliseconds cannot be negative")
        argv += [f"--{key}-ms", value]
    if "--store" in argv and "--group-ms" in argv:
        raise ValueError(f"--hops entry {entry!r}: group= stands in for a store's commit; give it or store=, not both")
    return name, argv


def hop_suffix(name: str) -> str:
    """A hop path's name as a file-name part: ``hop:wait=10,busy=2`` -> ``hop-wait10-busy2``."""
    return name.replace(":", "-").replace("=", "").replace(",", "-")


def start_hop(entry: str, engine: LoadPath, out: Path, stack: ExitStack, result: dict, say, env: dict) -> LoadPath:
    """bench/hop.py for ``entry`` in front of ``engine``'s server (the proxy's fields as ``engine``'s request has
    them); its path takes plain requests, as the proxy's does. Stopped when ``stack`` closes."""
    name, words = hop_spec(entry, out)
    fields = "json" if engine.request == "json" else "numeric"
    argv = [sys.executable, str(HERE / "hop.py"), "--upstream", engine.url, "--fields", fields, *words]
    db = Path(words[words.index("--store") + 1]) if "--store" in words else None
    if db is not None:
        db.unlink(missing_ok=True)  # a file of an earlier run: this run's rows only
        stack.callback(lambda: db.unlink(missing_ok=True))  # after the hop's stop (the stack runs last-in first)
    proc = svb.Proc(argv, out.parent / f"{out.stem}-{hop_suffix(name)}.log", env)
    ph = result.setdefault("servers", {})[name] = {"argv": argv}
    stack.callback(lambda: ph.__setitem__("stop", proc.stop(grace_s=5)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.alive():
        urls = [line.split(" ", 1)[1] for _, line in list(proc.lines) if line.startswith("URL ")]
        if urls:
            say(f"{name} listens at {urls[0]}, in front of {engine.url}")
            return LoadPath(name, urls[0], False, engine.model, engine.metrics_url)
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start (bench/hop.py); its log: {proc.log}")


def proxy_problem(variants: list[str]) -> str | None:
    """Why ``--proxies`` cannot run (one phrase), or None: bench/proxy_overhead.py's variants, in a plain process."""
    import proxy_overhead as po

    problem = po.variants_problem(variants)
    if problem:
        return f"--proxies: {problem}"
    actor = [v for v in variants if "actor" in po.flags(v)]
    if actor:
        return (f"--proxies {actor[0]!r}: +actor starts a Ray node of its own beside the serve's; give the variant "
                "without it (the serve's own proxy is the one in a Ray actor)")
    return None


def start_proxy_variant(variant: str, engine: LoadPath, out: Path, stack: ExitStack, result: dict, say) -> LoadPath:
    """Trinity's proxy app and recorder as bench/proxy_overhead.py runs them for ``variant`` (in a plain process, its
    model allocation a stand-in that always names ``engine``'s server), in front of ``engine``: the proxy's code outside
    the Explorer actor, with or without its recording. Stopped when ``stack`` closes; its rows counted then."""
    import proxy_overhead as po

    name = f"proxy:{variant}"
    work = out.parent / f"{out.stem}-{hop_suffix(name).replace('+', '-')}"
    work.mkdir(parents=True, exist_ok=True)
    proc, port = po.start_proxy(engine.url, variant, work, work)
    log = work / f"proxy-{variant}.log"
    ph = result.setdefault("servers", {})[name] = {"variant": variant, "log": str(log)}

    def stop() -> None:
        po.stop(proc)
        ph["stop"] = {"rc": proc.returncode, "rows": po.recorded_rows(log)}
    stack.callback(stop)
    base = f"http://127.0.0.1:{port}"
    po.wait_http(base + "/health", proc, 120)  # RuntimeError: one sentence, the run stops
    helpers = int(po.build_setting(variant)) or int(po.record_setting(variant))
    if helpers:
        po.wait_builders(log, helpers, proc, 300)
    say(f"{name} (Trinity's proxy in a process of its own) listens at {base}, in front of {engine.url}")
    return LoadPath(name, base, False, engine.model, engine.metrics_url)


def hop_stats(base: str) -> dict:
    """A hop's counts (its /hop/stats), or one phrase why not."""
    try:
        return svb.http_json(base + "/hop/stats", timeout=5)[1]
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def bare_fields_path(bare: LoadPath, env: dict) -> LoadPath:
    """The path that sends bare the proxy's own request (serve_vs_bare.py's ``engine_direct_request`` in ``env``:
    numeric logprobs unless the proxy's numeric-logprobs patch is switched off there)."""
    return LoadPath("bare-fields", bare.url, svb.engine_direct_request(env), bare.model, bare.metrics_url)


def say(msg: str) -> None:
    print(f"[interleave {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="interleave", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the model directory both servers load")
    ap.add_argument("--out", help="the result JSON (the servers' logs go next to it)")
    ap.add_argument("--table", metavar="RESULT", help="print a result's figures as a Markdown table, run nothing")
    ap.add_argument("--steps", action="store_true",
                    help="with --table: the engine's steps and the GPU's busy and idle time a step instead")
    ap.add_argument("--latency", action="store_true",
                    help="with --table: a request's time outside the engine and its queue, prefill and decode time instead")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", default="32,64", help="the equal-length levels")
    ap.add_argument("--spread", type=float, default=0.75, help="spread of the spread levels' lengths (0: none)")
    ap.add_argument("--spread-levels", default="32,64")
    ap.add_argument("--requests-per-client", type=int, default=16,
                    help="a level's requests: this times its concurrency (the long runs: 32)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--level-timeout", type=float, default=60.0)
    ap.add_argument("--gpu-util", type=float, default=0.4, help="each server's share of the GPU's memory")
    ap.add_argument("--max-model-len", type=int, default=sp.MAX_MODEL_LEN)
    ap.add_argument("--engine-direct", action="store_true", help="also the path straight to Trinity's engine")
    ap.add_argument("--bare-fields", action="store_true", help="also the proxy's own request sent to bare")
    ap.add_argument("--bare-variants", default="", help="';'-separated extra `vllm serve` argument sets, a path each")
    ap.add_argument("--hops", default="",
                    help="';'-separated bench/hop.py settings in front of Trinity's engine, a path each: none, "
                         "wait=MS, busy=MS, group=MS, store=disk|shm, or several joined by a comma (needs --engine-direct)")
    ap.add_argument("--proxies", default="",
                    help="','-separated bench/proxy_overhead.py variants (e.g. sqlite-build4+numeric, hop-gc+numeric): "
                         "Trinity's proxy in a plain process in front of Trinity's engine, a path each (needs --engine-direct)")
    ap.add_argument("--db-url", default=None,
                    help="the serve's experience store (explorer.db_url), e.g. sqlite:////dev/shm/x.db; default Trinity's")
    ap.add_argument("--serve-args", default="", help="more `rftstack serve` arguments, e.g. --skip-doctor")
    ap.add_argument("--ready-timeout", type=float, default=400)
    ap.add_argument("--no-ray-stop", action="store_true", help="never `ray stop --force` (a machine shared with other Ray work)")
    return ap


def check(args) -> str | None:
    """One sentence naming what is wrong with the arguments and how to fix it, or None."""
    if not args.model or not args.out:
        return "give --model DIR and --out RESULT.json (or --table RESULT.json to read a result)"
    if not Path(args.model).is_dir():
        return f"--model {args.model}: no such directory; give the model's directory (e.g. bench/model_3b.py's)"
    try:
        args.levels = loadgen.parse_levels(args.concurrency)
        args.spread_levels = loadgen.parse_levels(args.spread_levels)
    except SystemExit as exc:  # loadgen's one sentence
        return str(exc).replace("loadgen: ", "", 1)
    if args.rounds < 1 or args.requests_per_client < 1 or args.level_timeout <= 0:
        return "--rounds, --requests-per-client and --level-timeout must be positive"
    if not 0 <= args.spread < 1:
        return f"--spread {args.spread}: give a share between 0 (no spread levels) and 1 (not included)"
    args.variants = [v for v in args.bare_variants.split(";") if v.strip() not in ("", "default")]
    servers = 2 + len(args.variants)
    if not 0 < args.gpu_util or args.gpu_util * servers > 0.9:
        return (f"--gpu-util {args.gpu_util} for {servers} servers on one GPU asks for more than 0.9 of its memory; "
                f"give at most {0.9 / servers:.2f}")
    try:
        args.hop_entries = [e.strip() for e in args.hops.split(";") if e.strip()]
        names = [hop_spec(e, Path(args.out))[0] for e in args.hop_entries]
    except ValueError as e:
        return str(e)
    if len(set(names)) < len(names):
        return f"--hops {args.hops!r} names a setting twice; give each once"
    if names and not args.engine_direct:
        return "--hops puts a hop in front of Trinity's engine: give --engine-direct too"
    args.proxy_variants = [v.strip() for v in args.proxies.split(",") if v.strip()]
    if args.proxy_variants:
        if not args.engine_direct:
            return "--proxies puts Trinity's proxy in front of Trinity's engine: give --engine-direct too"
        problem = proxy_problem(args.proxy_variants)
        if problem:
            return problem
    if len(set(args.variants)) < len(args.variants):
        return f"--bare-variants {args.bare_variants!r} names a variant twice; give each once"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.steps and args.latency:
        print("interleave: --steps and --latency are two tables: give one", file=sys.stderr)
        return 2
    if args.table:
        try:
            data = json.loads(Path(args.table).read_text())
            print(steps_table(data) if args.steps else latency_table(data) if args.latency else table(data))
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = e if isinstance(e, Missing) else f"{type(e).__name__}: {e}"
            print(f"interleave: {args.table}: {why}; give a result file bench/interleave.py wrote", file=sys.stderr)
            return 2
        return 0
    problem = check(args)
    if problem:
        print(f"interleave: {problem}", file=sys.stderr)
        return 2
    svb.RAY_STOP = not args.no_ray_stop
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
                    "command": " ".join([sys.executable, *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "model": str(Path(args.model).resolve()), "max_tokens": args.max_tokens, "gpu_util": args.gpu_util,
                    "requests_per_client": args.requests_per_client}

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    rc = 0
    try:
        with ExitStack() as stack:
            paths = start_serve(args, out, stack, result, say)  # first: its doctor sees the GPU free
            proxy_url = paths[0].url
            bare = start_bare(args, out, stack, result, say, "")
            paths.append(bare)
            if args.bare_fields:
                paths.append(bare_fields_path(bare, sp.child_env()))
            for v in args.variants:
                paths.append(start_bare(args, out, stack, result, say, v))
            engine = next((p for p in paths if p.name == "engine"), None)
            for entry in args.hop_entries:
                paths.append(start_hop(entry, engine, out, stack, result, say, sp.child_env()))
            for variant in args.proxy_variants:
                paths.append(start_proxy_variant(variant, engine, out, stack, result, say))
            paths.sort(key=lambda p: p.name != REFERENCE)  # bare leads round 1
            save()
            run_rounds(paths, args, result, save, say)
            result["servers"]["trinity"]["proxy_metrics"] = proxy_metrics(proxy_url)
            for p in paths:
                if p.name.startswith("hop"):
                    result["servers"][p.name]["stats"] = hop_stats(p.url)
            say(f"rounds done; the proxy's counts: {result['servers']['trinity']['proxy_metrics']}; stopping the servers")
    except RuntimeError as e:
        result["error"] = str(e)
        print(f"interleave: {e}", file=sys.stderr)
        rc = 1
    finally:
        result["gpu_memory_after_mib"] = svb.wait_gpu_free()
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        save()
    if rc == 0:
        try:
            print(table(result))
        except Missing as e:
            print(f"interleave: {e} ({out})", file=sys.stderr)
            return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
