"""Where the time goes when `rftstack serve` is under load (GPU host): the proxy's ceiling, explained.

One `rftstack serve` of the model (serve_vs_bare.py's config: the report's, on loopback), then for each
concurrency level a closed loop of clients for ``--warmup-s`` + ``--window-s``:

  proxy    through Trinity's proxy (as users call it)
  engine   straight to the vLLM OpenAI server inside Trinity's engine actor, with what the proxy adds to
           every request (logprobs, return_token_ids): the engine's own rate at that concurrency

With ``RFTSTACK_ENGINE_LOG_STATS=1`` in the environment (patches/trinity-engine-log-stats.patch: Trinity's engine keeps
vLLM's statistics), every serve window also carries the engine's own account from its /metrics, as bare's do.

Per window: responses/s, p50/p99 latency, and the CPU of every process from /proc (bench/proc_cpu.py: cores
used, CPU ms per response, the busiest threads; a thread near 1.0 core is a bound), and of the machine (cores busy,
steal: what the hypervisor took; a cgroup's throttling where there is one). With ``--py-spy``, the
Explorer actor (the proxy's event loop), the engine actor (vLLM's OpenAI server and AsyncLLM), the
EngineCore and the worker (the mp executor's) are sampled together during one more proxy window at the last level (``--nonblocking --threads``):
per process its threads, and its busiest thread's stages (bench/proxy_profile.py's rules) in CPU ms per response
from that thread's /proc time. With ``--bare``, the same windows against
bare ``vllm serve`` afterwards, plain and
like the proxy (its API server and EngineCore's CPU; with ``--py-spy`` both sampled, like the proxy), and the
engine's own account of each window from its /metrics (bench/engine_metrics.py: steps/s, tokens per step, running
requests, per-request time in the frontend against time scheduled). ``--bare-variants`` runs bare once per set of
extra ``vllm serve`` arguments (e.g. ``default;--api-server-count 2;VLLM_USE_RUST_FRONTEND=1``: ``NAME=VALUE`` words go to its
environment; the word ``@ray-actor`` runs that variant's server, same arguments, inside one plain Ray actor instead:
bench/vllm_in_ray.py, the step between bare and Trinity's engine actor, whose own ``--worker-niceness N`` may be
among the words; its profile samples ``ray::VllmServeActor`` for the API server); ``--rounds N`` runs that list N
times (A B A B: one start of a server against the next); ``--engine-args JSON`` gives
the serve's engine more vLLM arguments (Trinity's ``extra_engine_args``);
``--bare-profile-requests plain,numeric`` gives bare one profile window per kind of request (py-spy on its API
server, EngineCore and, with the mp executor, its worker); ``--no-serve`` skips the serve; ``--numeric`` adds a window per level with the proxy's fields and numeric
logprobs (straight to the engine, and to bare: what patches/vllm-logprobs-numeric.patch saves the frontend).

    python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out /tmp/gs/bench/profile-qwen3b.json \\
        [--concurrency 32,64] [--window-s 8] [--py-spy /tmp/py-spy] [--bare]

Writes the JSON (after every window), the serve's log next to it, and the collapsed stacks (gzip).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import engine_metrics  # noqa: E402
import gpu_busy  # noqa: E402
import loadgen  # noqa: E402
import proc_cpu  # noqa: E402
import proxy_profile as pp  # noqa: E402
import serve_vs_bare as svb  # noqa: E402


class Loop(pp.Load):
    """proxy_profile's closed loop, with the rate and latency of a window."""

    def between(self, t0: float, t1: float) -> dict:
        xs = [(ok, lat) for t, ok, lat in list(self.done) if t0 <= t < t1]
        lats = sorted(lat for ok, lat in xs if ok)
        ok = len(lats)

        def q(p: float) -> float | None:
            return round(lats[min(len(lats) - 1, int(p * len(lats)))], 4) if lats else None
        return {"responses": ok, "errors": len(xs) - ok, "responses_per_s": round(ok / (t1 - t0), 2),
                "output_tokens_per_s": round(ok * self.max_tokens / (t1 - t0), 1),
                "latency_s": {"p50": q(0.5), "p99": q(0.99), "mean": round(statistics.fmean(lats), 4) if lats else None}}


def measured_window(loop: Loop, seconds: float, during=None) -> dict:
    """``seconds`` of the running loop (``during``, a callable, runs instead of the sleep): its rate, every
    process's CPU and how busy the GPU was (bench/gpu_busy.py)."""
    gpu = gpu_busy.Sampler()
    gpu.start()
    m0 = proc_cpu.machine_snapshot()
    a = proc_cpu.snapshot()
    t0 = time.monotonic()
    extra = None
    if during:
        extra = during()
    else:
        time.sleep(seconds)
    t1 = time.monotonic()
    b = proc_cpu.snapshot()
    m1 = proc_cpu.machine_snapshot()
    out = loop.between(t0, t1)
    out["wall_s"] = round(t1 - t0, 2)
    out["processes"] = proc_cpu.window(a, b, t1 - t0, responses=out["responses"] or None)
    out["machine"] = proc_cpu.machine_window(m0, m1, t1 - t0)
    out["gpu"] = gpu.stop(responses=out["responses"] or None, wall_s=t1 - t0)
    if extra is not None:
        out["during"] = extra
    return out


def run_loop(base: str, model: str, c: int, args, like_proxy: bool | str, during=None) -> dict:
    loop = Loop(base, c, args.max_tokens, model=model, like_proxy=like_proxy)
    loop.thread.start()
    try:
        time.sleep(args.warmup_s)
        return measured_window(loop, args.window_s, during)
    finally:
        loop.stop = True
        loop.thread.join(timeout=90)


def metered_loop(base: str, model: str, c: int, args, like_proxy: bool | str, metrics_url: str | None = None) -> dict:
    """run_loop's window against ``base``, with the engine's account under "engine" from vLLM's /metrics at
    ``metrics_url`` (default ``base``: bare vLLM; the serve's engine when the loop goes through the proxy)."""
    url = metrics_url or base
    w = run_loop(base, model, c, args, like_proxy=like_proxy, during=lambda: engine_metrics.during_window(url, args.window_s))
    w["engine"] = w.pop("during")
    if isinstance(w["engine"], dict):
        w["gpu"]["busy_ms_per_step"] = gpu_busy.per_step(w["gpu"], w["engine"].get("steps_per_s"))
    return w


def thread_profile(stacks: list[tuple[list[str], int]], tid_cpu: dict[int, float], responses: int) -> dict:
    """Per sampled thread: samples, categories; for the thread with the most samples outside epoll (the
    event loop), the stages of a response, in CPU ms per response from that thread's /proc time."""
    by_tid: dict[int, list[tuple[list[str], int]]] = {}
    names: dict[int, str] = {}
    for frames, n in stacks:
        root = frames[0] if frames and frames[0].startswith("thread (") else ""
        tid = int(root[len("thread ("):].split(")", 1)[0]) if root else 0
        names[tid] = root.split(": ", 1)[1] if ": " in root else ""
        by_tid.setdefault(tid, []).append((frames[1:] if root else frames, n))
    threads = {}
    for tid, st in by_tid.items():
        cats: Counter = Counter()
        for frames, n in st:
            cats[pp.categorise(frames)] += n
        threads[tid] = {"name": names[tid], "samples": sum(cats.values()), "busy_samples": sum(v for k, v in cats.items() if k != pp.EPOLL),
                        "cpu_s": tid_cpu.get(tid), "categories": dict(cats.most_common(12))}
    if not threads:
        return {"threads": {}}
    loop_tid = max(threads, key=lambda t: threads[t]["busy_samples"])
    counts: Counter = Counter()
    for frames, n in by_tid[loop_tid]:
        if pp.categorise(frames) != pp.EPOLL:
            counts[pp.stage(frames)] += n
    busy = sum(counts.values())
    per = 1000 * (tid_cpu.get(loop_tid) or 0.0) / responses if responses else 0.0
    return {"threads": {str(k): v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]["samples"])},
            "loop_thread": {"tid": loop_tid, "name": threads[loop_tid]["name"], "cpu_ms_per_response": round(per, 3),
                            "cpu_ms_per_response_by_stage": {k: round(v / busy * per, 3) for k, v in counts.most_common()} if busy else {},
                            "top_inclusive_ms_per_response": top_inclusive(by_tid[loop_tid], per)}}


def top_inclusive(stacks: list[tuple[list[str], int]], ms_per_response: float, top: int = 30) -> dict[str, float]:
    """The functions a busy thread's samples pass through (each counted once per sample, epoll waits left
    out), as CPU ms per response: where the time of any process goes, not only the proxy's stages."""
    counts: Counter = Counter()
    for frames, n in stacks:
        if pp.categorise(frames) == pp.EPOLL:
            continue
        seen = set()
        for f in frames:
            func, path = pp.parse_frame(f)
            seen.add(f"{func} ({path or 'native'})")
        for k in seen:
            counts[k] += n
    busy = sum(n for frames, n in stacks if pp.categorise(frames) != pp.EPOLL)
    return {k: round(v / busy * ms_per_response, 3) for k, v in counts.most_common(top)} if busy else {}


def collapsed_file(out_dir: Path, label: str, target: str, c: int | str) -> Path:
    """Where a profile window of ``label`` keeps ``target``'s stacks at level ``c`` (bench/stack_frames.py reads them)."""
    name = target.strip("*").replace("::", "-").replace(" ", "-").replace("/", "")
    return out_dir / f"{label}-{name}-c{c}.collapsed.gz"


def profile_targets(base: str, model: str, c: int, args, py_spy: list[str], out_dir: Path, targets: list[str],
                    label: str, like_proxy: bool | str = False) -> dict:
    """One more window at concurrency ``c`` against ``base``, with py-spy recording each process whose
    command line starts with one of ``targets`` (bench/proc_cpu.py ``find``) at the same time; per target its
    threads and its busiest thread's stages."""
    snap = proc_cpu.snapshot()
    pids = {t: proc_cpu.find(snap, t)[:1] for t in targets}
    found = {t: p[0] for t, p in pids.items() if p}
    res: dict = {"targets": {t: {"error": "no such process"} for t in targets if t not in found}}
    if not found:
        return res
    raws = {t: out_dir / f"{label}-{pid}.raw.txt" for t, pid in found.items()}

    def during() -> dict:
        a = proc_cpu.snapshot()
        recs: dict = {}
        threads = [threading.Thread(target=lambda t=t: recs.__setitem__(t, pp.py_spy_record(py_spy, found[t], args.py_spy_s, args.rate, raws[t])))
                   for t in found]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        b = proc_cpu.snapshot()
        for t, pid in found.items():
            before = a.get(pid, {"threads": {}})["threads"]
            recs[t]["tid_cpu_s"] = {tid: (v[1] - before.get(tid, (None, v[1]))[1]) / proc_cpu.TICK
                                    for tid, v in b.get(pid, {"threads": {}})["threads"].items()}
        return recs
    w = run_loop(base, model, c, args, like_proxy=like_proxy, during=during)
    recs = w.pop("during")
    res["window"] = w
    for t, pid in found.items():
        rec = recs[t]
        tid_cpu = rec.pop("tid_cpu_s")
        r: dict = {"pid": pid, "py_spy": rec}
        res["targets"][t] = r
        raw = raws[t]
        if rec["rc"] != 0 or not raw.exists():
            r["error"] = "py-spy could not record it (needs ptrace: root, or kernel.yama.ptrace_scope=0)"
            continue
        stacks = pp.read_collapsed(raw.read_text())
        collapsed_file(out_dir, label, t, c).write_bytes(gzip.compress(pp.normalise(stacks).encode(), mtime=0))
        raw.unlink()
        r.update(thread_profile(stacks, tid_cpu, w["responses"]))
        r["top_self"] = pp.summarise(stacks, top=25)["top_self"]
    return res


def child_env() -> dict:
    """This process's environment for the serve and bare vLLM (FlashInfer's sampler off: no cubin in the bundle)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_USE_FLASHINFER_SAMPLER": os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "0")}


def profile_and_say(ph: dict, base: str, model: str, args, out: Path, targets: list[str], label: str, save,
                    like_proxy: bool | str = False, key: str = "profile") -> None:
    """With --py-spy: the profile window of ``targets`` at the last level, into ``ph[key]``, one line each. Its stacks
    go next to ``out``, their names led by its stem: two result files in one folder (host_session.sh's engine3b-anyio)
    keep a serve's stacks each (session AE's second serve wrote over the first's when both were ``serve-``)."""
    if not args.py_spy:
        return
    prof = ph[key] = profile_targets(base, model, args.levels[-1], args, args.py_spy, out.parent, targets,
                                     f"{out.stem}-{label}", like_proxy=like_proxy)
    for t, r in prof["targets"].items():
        say(f"profile {t}: {json.dumps(r.get('loop_thread') or r.get('error'))}")
    save()


def with_engine_args(cfg: Path, engine_args: dict) -> None:
    """Give the serve config's engine these vLLM engine arguments (Trinity's
    ``explorer.rollout_model.extra_engine_args``, which its engine passes to AsyncEngineArgs)."""
    import yaml

    data = yaml.safe_load(cfg.read_text())
    data["explorer"]["rollout_model"]["extra_engine_args"] = dict(engine_args)
    cfg.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def serve_config(args, out: Path) -> tuple[Path, int, Path]:
    """(its work folder, emptied; the proxy's port; the report's serve config on ``args.model`` with ``args``'s memory
    share and context length) for a serve whose result is ``out`` (bench/interleave.py's too)."""
    work = out.parent / f"{out.stem}-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port = svb.free_port()
    cfg = svb.trinity_config(work / "serve.yaml", model=Path(args.model).resolve(), label=out.stem,
                             max_model_len=args.max_model_len, gpu_util=args.gpu_util, proxy_port=port,
                             ckpt=work / "ckpt", db_url=getattr(args, "db_url", None))
    return work, port, cfg


def serve_phase(args, result: dict, out: Path, save) -> None:
    work, port, cfg = serve_config(args, out)
    if args.engine_args:
        with_engine_args(cfg, args.engine_args)
    env = child_env()
    before = svb.listening_ports()
    proc = svb.Proc([sys.executable, "-m", "rftstack", "serve", "-c", str(cfg), "--run-dir", str(work / "run"), *args.serve_args.split()],
                    out.parent / f"{out.stem}-serve.log", env)
    ph: dict = {"config": str(cfg), "engine_args": args.engine_args}
    result["serve"] = ph
    try:
        base = f"http://127.0.0.1:{port}"
        ph["ready"] = svb.wait_ready(base, proc, time.monotonic() + args.ready_timeout)
        save()
        if not ph["ready"]["ready"]:
            ph["log_tail"] = proc.tail(40)
            return
        model = ph["ready"]["model"]
        engines = svb.find_openai_servers(svb.listening_ports() - before, exclude={port})
        ph["engine_urls"] = engines
        # with RFTSTACK_ENGINE_LOG_STATS=1 (patches/trinity-engine-log-stats.patch) the engine's /metrics has vLLM's
        # statistics: every window, through the proxy too, then carries the engine's account as bare's do
        ph["engine_stats"] = bool(engines) and engine_metrics.keeps_stats(engines[0])
        say(f"the engine's statistics: {'on' if ph['engine_stats'] else 'off (as upstream Trinity)'}")

        def loop(url: str, c: int, like_proxy: bool | str) -> dict:
            if ph["engine_stats"]:
                return metered_loop(url, model, c, args, like_proxy=like_proxy, metrics_url=engines[0])
            return run_loop(url, model, c, args, like_proxy=like_proxy)
        ph["levels"] = {}
        for c in args.levels:
            lv = ph["levels"][str(c)] = {}
            lv["proxy"] = loop(base, c, False)
            say(f"c={c} proxy: {summary_line(lv['proxy'])}")
            save()
            if engines:
                lv["engine"] = loop(engines[0], c, True)
                say(f"c={c} engine direct: {summary_line(lv['engine'])}")
                save()
                if args.numeric:
                    lv["engine_numeric"] = loop(engines[0], c, loadgen.NUMERIC)
                    say(f"c={c} engine direct, numeric logprobs: {summary_line(lv['engine_numeric'])}")
                    save()
        profile_and_say(ph, base, model, args, out, SERVE_TARGETS, "serve", save)
    finally:
        ph["stop"] = proc.stop(grace_s=30)
        ph["ray_stop"] = svb.ray_stop_force()
        ph["gpu_memory_after_mib"] = svb.wait_gpu_free()
        save()


# the serve's and bare's GPU memory share and context length unless given (the same for both)
GPU_UTIL = 0.6
MAX_MODEL_LEN = 2048
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
# the serve's processes sampled in its profile window (through the proxy): the Explorer (the proxy), the engine actor
# (vLLM's API server and AsyncLLM inside Ray), its EngineCore, and its worker (the mp executor's model runner)
SERVE_TARGETS = ["ray::Explorer", "ray::vLLMRolloutModel", "VLLM::EngineCore", "VLLM::Worker"]
# bare vLLM's processes sampled in a profile window: its API server, its EngineCore, and its worker (the model
# runner's process with the mp executor; on uni it runs inside the EngineCore and the target finds no process)
BARE_TARGETS = ["*vllm serve", "VLLM::EngineCore", "VLLM::Worker"]
# a --bare-variants word: that bare runs `vllm serve` inside one plain Ray actor (bench/vllm_in_ray.py), whose process
# (Ray titles it ray::VllmServeActor) is its API server's in the profile window
RAY_ACTOR_WORD = "@ray-actor"
RAY_ACTOR_TARGETS = ["ray::VllmServeActor", "VLLM::EngineCore", "VLLM::Worker"]
# --bare-profile-requests: the request each bare profile window sends (loadgen's like_proxy)
PROFILE_REQUESTS: dict[str, bool | str] = {"plain": False, "fields": True, "numeric": loadgen.NUMERIC}


def bare_args(variant: str) -> list[str]:
    """One ``--bare-variants`` entry as its words ("" or "default": none): ``NAME=VALUE`` words set the
    environment of that ``vllm serve`` (e.g. VLLM_USE_RUST_FRONTEND=1), the others are its arguments."""
    return [] if variant.strip() in ("", "default") else variant.split()


def split_variant(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = dict(w.split("=", 1) for w in words if ENV_WORD.match(w))
    return env, [w for w in words if not ENV_WORD.match(w)]


def bare_argv(model: str, port: int, gpu_util: float, max_model_len: int,
              words: list[str]) -> tuple[str, list[str], dict[str, str]]:
    """(its launcher, its command line, its environment's additions) for a bare run of a variant's ``words``:
    ``vllm serve MODEL ...``, or with the word ``@ray-actor`` (dropped from the arguments) the same arguments to
    bench/vllm_in_ray.py, which runs that server inside a Ray actor (launcher "ray-actor", else "vllm-serve")."""
    launcher = "ray-actor" if RAY_ACTOR_WORD in words else "vllm-serve"
    env, args = split_variant([w for w in words if w != RAY_ACTOR_WORD])
    head = [sys.executable, str(HERE / "vllm_in_ray.py")] if launcher == "ray-actor" else ["vllm", "serve"]
    return launcher, [*head, str(model), "--host", "127.0.0.1", "--port", str(port), "--gpu-memory-utilization",
                      str(gpu_util), "--max-model-len", str(max_model_len), *args], env


def log_name(words: str, limit: int = 80) -> str:
    """A variant's words as part of a file name: characters other than letters, digits, '.', '_' and '-' become
    '_' (a JSON argument's braces and quotes), and a name longer than ``limit`` is cut, with a hash of the whole
    so that two long variants stay apart."""
    import hashlib

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", words).strip("_")
    if len(safe) <= limit:
        return safe
    return f"{safe[:limit - 13]}-{hashlib.sha256(words.encode()).hexdigest()[:12]}"


def variant_names(extra: list[str], round_no: int = 1) -> tuple[str | None, str]:
    """(its key under the result's ``bare_variants``, None for the first default run, which is ``bare``;
    the suffix of its log's name): a variant's words, and " #N" / "-rN" from round 2 on."""
    name = log_name("-".join(a.lstrip("-").replace("=", "-") for a in extra))
    if round_no == 1:
        return (" ".join(extra) or None), name
    return f"{' '.join(extra) or 'default'} #{round_no}", f"{name or 'default'}-r{round_no}"


def bare_phase(args, result: dict, out: Path, save, variant: str = "", round_no: int = 1) -> None:
    """Bare ``vllm serve`` (with ``variant``'s extra arguments; with ``@ray-actor`` among them inside a Ray actor,
    bench/vllm_in_ray.py), plain and like the proxy at each level, each
    window with the engine's own account from its /metrics (bench/engine_metrics.py). Round 2 and later
    (``--rounds``) are kept under ``bare_variants`` as "VARIANT #N" ("default #2" for no arguments)."""
    port = svb.free_port()
    base = f"http://127.0.0.1:{port}"
    extra = bare_args(variant)
    launcher, argv, env_extra = bare_argv(args.model, port, args.gpu_util, args.max_model_len, extra)
    key, name = variant_names(extra, round_no)
    proc = svb.Proc(argv, out.parent / f"{out.stem}-bare{'-' + name if name else ''}.log", {**child_env(), **env_extra})
    ph: dict = {"argv": argv, "env": env_extra, "round": round_no, "launcher": launcher}
    if key is None:
        result["bare"] = ph
    else:
        result.setdefault("bare_variants", {})[key] = ph
    label = f"bare {' '.join(extra)}".strip() + (f" #{round_no}" if round_no > 1 else "")
    try:
        ph["ready"] = svb.wait_ready(base, proc, time.monotonic() + args.ready_timeout)
        save()
        if not ph["ready"]["ready"]:
            ph["log_tail"] = proc.tail(40)
            return
        ph["levels"] = {}
        for c in args.levels:
            lv = ph["levels"][str(c)] = {"bare": metered_loop(base, ph["ready"]["model"], c, args, like_proxy=False)}
            say(f"c={c} {label}: {summary_line(lv['bare'])}")
            lv["bare_like_proxy"] = metered_loop(base, ph["ready"]["model"], c, args, like_proxy=True)
            say(f"c={c} {label}, like the proxy: {summary_line(lv['bare_like_proxy'])}")
            if args.numeric:
                lv["bare_like_proxy_numeric"] = metered_loop(base, ph["ready"]["model"], c, args, like_proxy=loadgen.NUMERIC)
                say(f"c={c} {label}, like the proxy with numeric logprobs: {summary_line(lv['bare_like_proxy_numeric'])}")
            save()
        for kind in args.bare_profile_requests:
            profile_and_say(ph, base, ph["ready"]["model"], args, out, RAY_ACTOR_TARGETS if launcher == "ray-actor" else BARE_TARGETS,
                            "bare" + (f"-{name}" if name else "") + ("" if kind == "fields" else f"-{kind}"), save,
                            like_proxy=PROFILE_REQUESTS[kind], key="profile" if kind == "fields" else f"profile_{kind}")
    finally:
        ph["stop"] = proc.stop(grace_s=20)
        ph["gpu_memory_after_mib"] = svb.wait_gpu_free()
        save()


def summary_line(w: dict) -> str:
    procs = ", ".join(f"{p['title'][:28]} {p['cores']} cores (top thread {p['top_threads'][0]['cores'] if p['top_threads'] else 0})"
                      for p in w["processes"][:4])
    eng = w.get("engine")
    said = ""
    if isinstance(eng, dict) and "steps_per_s" in eng:
        said = (f"; engine: {eng['steps_per_s']} steps/s, {eng['tokens_per_step']} tokens/step, {eng['running_mean']} running, "
                f"e2e {eng['mean_s']['e2e_request_latency']} s, inference {eng['mean_s']['request_inference_time']} s")
    elif isinstance(eng, dict) and "error" in eng:
        said = f"; engine: {eng['error']}"
    machine = f"; {proc_cpu.machine_line(w['machine'])}" if "machine" in w else ""
    machine += f"; {gpu_busy.line(w['gpu'])}" if "gpu" in w else ""
    return (f"{w['responses_per_s']} resp/s, p50 {w['latency_s']['p50']} s, p99 {w['latency_s']['p99']} s, errors {w['errors']}; "
            f"{procs}{said}{machine}")


def say(msg: str) -> None:
    print(f"[serve_profile {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument("--concurrency", default="32,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--py-spy", default=None, help="the py-spy command: profile the Explorer actor at the last level")
    ap.add_argument("--py-spy-s", type=int, default=8)
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--bare", action="store_true", help="also bare `vllm serve`, after the serve")
    ap.add_argument("--bare-variants", default="",
                    help="with --bare: ';'-separated extra `vllm serve` arguments, one bare run each, in order "
                         "(\"default\" or empty: none; NAME=VALUE words: its environment; the word @ray-actor: that "
                         "server inside a plain Ray actor, bench/vllm_in_ray.py), "
                         "e.g. 'default;--api-server-count 2;VLLM_USE_RUST_FRONTEND=1;@ray-actor'")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --bare: run the list of variants this many times, in order (A B A B for 2): "
                         "how much one start of the same server differs from the next")
    ap.add_argument("--no-serve", action="store_true", help="skip `rftstack serve` (with --bare: bare runs only)")
    ap.add_argument("--numeric", action="store_true",
                    help="one more window per level with the proxy's fields and numeric logprobs, straight to the engine "
                         "and to bare (patches/vllm-logprobs-numeric.patch)")
    ap.add_argument("--bare-profile-requests", default="fields",
                    help="with --bare and --py-spy: the requests of bare's profile windows, one window each, "
                         "comma-separated: plain, fields (the proxy's, JSON logprobs; the default), numeric "
                         "(the fields with numeric logprobs), e.g. plain,numeric: where a step's time goes with and without them")
    ap.add_argument("--engine-args", default="",
                    help="a JSON object of vLLM engine arguments for the serve's engine (Trinity's extra_engine_args), "
                         "e.g. '{\"max_num_batched_tokens\": 8192, \"max_num_seqs\": 1024}'")
    ap.add_argument("--serve-args", default="", help="more `rftstack serve` arguments, e.g. --skip-doctor")
    ap.add_argument("--gpu-util", type=float, default=GPU_UTIL)
    ap.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    ap.add_argument("--ready-timeout", type=float, default=300)
    args = ap.parse_args(argv)
    try:
        args.levels = loadgen.parse_levels(args.concurrency)
    except SystemExit as exc:  # loadgen's one sentence
        print(str(exc).replace("loadgen:", "serve_profile:", 1), file=sys.stderr)
        return 2
    if args.warmup_s < 0 or args.window_s <= 0 or args.py_spy_s < 1 or args.rate < 1:
        print("serve_profile: --window-s, --py-spy-s and --rate must be positive, --warmup-s not negative", file=sys.stderr)
        return 2
    args.variants = args.bare_variants.split(";") if args.bare_variants else [""]
    if args.no_serve and not args.bare:
        print("serve_profile: --no-serve leaves nothing to run; add --bare", file=sys.stderr)
        return 2
    try:
        args.engine_args = json.loads(args.engine_args) if args.engine_args else {}
    except ValueError:
        args.engine_args = None
    if not isinstance(args.engine_args, dict) or (args.engine_args and args.no_serve):
        print("serve_profile: --engine-args must be a JSON object of engine arguments, and needs the serve "
              "(drop --no-serve)", file=sys.stderr)
        return 2
    if args.rounds < 1 or (args.rounds > 1 and not args.bare):
        print("serve_profile: --rounds must be 1 or more, and more than 1 only with --bare", file=sys.stderr)
        return 2
    if args.bare_variants and not args.bare:
        print("serve_profile: --bare-variants needs --bare", file=sys.stderr)
        return 2
    if len({" ".join(bare_args(v)) for v in args.variants}) < len(args.variants):
        print(f"serve_profile: --bare-variants {args.bare_variants!r} names a variant twice; give each once", file=sys.stderr)
        return 2
    args.bare_profile_requests = [k.strip() for k in args.bare_profile_requests.split(",") if k.strip()]
    unknown = [k for k in args.bare_profile_requests if k not in PROFILE_REQUESTS]
    if unknown or not args.bare_profile_requests or len(set(args.bare_profile_requests)) < len(args.bare_profile_requests):
        print(f"serve_profile: --bare-profile-requests names {', '.join(unknown) or 'none or one twice'}; give some of "
              f"{', '.join(PROFILE_REQUESTS)} once each, comma-separated", file=sys.stderr)
        return 2
    if args.py_spy:
        args.py_spy = pp.resolve_py_spy(args.py_spy)
        if args.py_spy is None:
            print(f"serve_profile: {pp.PY_SPY_FIX}", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                                "sched_autogroup": proc_cpu.sched_autogroup()},
                    "command": " ".join([sys.executable, *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "model": str(Path(args.model).resolve()), "max_tokens": args.max_tokens, "window_s": args.window_s}

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_serve:
        serve_phase(args, result, out, save)
    if args.bare:
        for round_no in range(1, args.rounds + 1):
            for variant in args.variants:
                bare_phase(args, result, out, save, variant, round_no)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
