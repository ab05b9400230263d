"""A closed-loop load generator for any OpenAI-compatible ``/v1/chat/completions`` endpoint.

For each concurrency level C, C workers send requests back to back until N requests are done (or
the level's time limit passes: then no new request starts and the level is marked truncated).
Every request uses a fixed prompt from a deterministic set, a fixed ``max_tokens`` and
``ignore_eos: true`` (a vLLM extension; Trinity's proxy forwards the whole request body, so it
reaches vLLM on both paths), so every successful request produces exactly ``max_tokens`` tokens.
With ``--max-tokens-spread S`` (0 < S < 1) request i asks for ``max_tokens_for(i, M, S)`` tokens:
an integer drawn uniformly from [M(1-S), M(1+S)], seeded by i (the request's number within its
level), so every path gets the same sequence and the mean stays about M. Equal lengths make a level's requests finish together (the
worst case for anything that handles responses one at a time, such as a proxy); spread lengths
let them finish at different times, as an agent's varied answers do.

Measured per level: output tokens/s (sum of ``usage.completion_tokens`` / level wall time),
requests/s, latency p50/p90/p99/mean/max over successful requests, errors by kind, and
"short" responses (fewer tokens than asked: a sign that ignore_eos was dropped on the way).
``steady``: the same rates over the level's steady window only, without its ramp-up and drain
(:func:`steady_window`).

Trinity's proxy rewrites three fields on every request: ``logprobs: true``,
``return_token_ids: true`` (for its experience recorder) and ``temperature`` (from its config).
``--like-proxy`` sends the same to a bare vLLM, to separate the cost of the proxy hop and the
recorder from the cost of computing logprobs.

    python bench/loadgen.py --base-url http://127.0.0.1:8000 --concurrency 1,8,32,64 \\
        --requests 128 --max-tokens 64 --out results/bare.json --label bare
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_busy  # noqa: E402
import proc_cpu  # noqa: E402

WORDS = (
    "the agent posts feedback after each answer and commits when the episode ends while the model "
    "keeps serving requests through the proxy that records every token and its log probability"
).split()


def prompts(n: int = 64, words: int = 48, seed: int = 0) -> list[str]:
    """A fixed, deterministic prompt set: ``n`` prompts of ``words`` words each."""
    rng = random.Random(seed)
    return [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def max_tokens_for(i: int, max_tokens: int, spread: float) -> int:
    """Request i's max_tokens: ``max_tokens`` when spread is 0, else a seeded uniform draw from
    [max_tokens(1-spread), max_tokens(1+spread)] (the same for request i on every path)."""
    if spread <= 0:
        return max_tokens
    lo = max(1, round(max_tokens * (1 - spread)))
    hi = max(lo, round(max_tokens * (1 + spread)))
    return random.Random(f"max_tokens/{i}").randint(lo, hi)


NUMERIC = "numeric"  # like_proxy's value for the proxy's request with numeric logprobs


def request_body(model: str, prompt: str, max_tokens: int, *, temperature: float, like_proxy: bool | str) -> dict:
    """One chat request; ``like_proxy`` True adds what Trinity's proxy adds (logprobs, token ids), NUMERIC also
    the mark with which it asks for numeric logprobs (patches/trinity-proxy-numeric-logprobs.patch)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": temperature,
    }
    if like_proxy:
        body.update(logprobs=True, return_token_ids=True)
    if like_proxy == NUMERIC:
        body["vllm_xargs"] = {"rftstack_logprobs_numeric": 1}
    return body


STEADY_MIN_WINDOW_S = 0.5  # a shorter steady window is reported as null


def steady_window(records: list[dict], wall_s: float, *, concurrency: int,
                  min_window_s: float = STEADY_MIN_WINDOW_S) -> dict:
    """A level's rates in its steady state: while all C = ``concurrency`` clients have a request in flight.

    The window runs from t_a, the time by which C requests (of any outcome) have ended (the first
    wave, sent all at once, is done), to t_b, the latest start of any request (after it no request
    starts, the drain begins and fewer than C are in flight). Times are the records' ``t_start`` and
    ``t_end``: seconds since the level's start. Counted are the successful requests that end in
    (t_a, t_b]: ``output_tokens_per_s`` is their ``completion_tokens`` / (t_b - t_a),
    ``requests_per_s`` their number / (t_b - t_a); ``window_s`` is t_b - t_a, ``from_s``/``to_s``
    t_a and t_b, ``requests`` and ``output_tokens`` what was counted, ``share_of_wall`` the
    window's share of the level's wall time.

    Why: the level's own ``output_tokens_per_s`` divides by the whole wall time, which includes the
    ramp-up (the first wave's requests all start at once and none ends for a while) and the drain
    (the last requests run with fewer than C in flight). In short levels those are a large share of
    the window and weigh differently for a faster and a slower endpoint, so the ratio of two
    endpoints measured this way (proxy against bare vLLM) leaves ramp-up and drain out and is less
    noisy than the ratio of whole-wall rates.

    When the records carry no times, or fewer than C requests ran, or the window is empty, shorter
    than ``min_window_s`` or holds fewer than C counted completions: ``{"output_tokens_per_s": None,
    "reason": ...}``.
    """
    null = lambda reason: {"output_tokens_per_s": None, "reason": reason}  # noqa: E731
    timed = [r for r in records if r.get("t_start") is not None and r.get("t_end") is not None]
    if not timed or len(timed) < len(records):
        return null("no request times")
    if len(timed) < concurrency:
        return null(f"fewer than {concurrency} requests")
    t_a = sorted(r["t_end"] for r in timed)[concurrency - 1]
    t_b = max(r["t_start"] for r in timed)
    window = t_b - t_a
    if window <= 0:
        return null("no window: the last request started before the first wave ended")
    if window < min_window_s:
        return null(f"window shorter than {min_window_s} s")
    counted = [r for r in timed if r["ok"] and t_a < r["t_end"] <= t_b]
    if len(counted) < concurrency:
        return null(f"fewer than {concurrency} completions in the window")
    tokens = sum(r["completion_tokens"] or 0 for r in counted)
    return {
        "output_tokens_per_s": round(tokens / window, 2),
        "requests_per_s": round(len(counted) / window, 3),
        "window_s": round(window, 6),
        "from_s": round(t_a, 6),
        "to_s": round(t_b, 6),
        "requests": len(counted),
        "output_tokens": tokens,
        "share_of_wall": round(window / wall_s, 4) if wall_s > 0 else None,
    }


def summarise(records: list[dict], wall_s: float, *, concurrency: int, max_tokens: int, truncated: bool,
              min_window_s: float = STEADY_MIN_WINDOW_S) -> dict:
    """One level's numbers from its request records ({ok, latency_s, completion_tokens, error}, the
    request's ``t_start``/``t_end`` in seconds since the level's start and, when lengths are spread,
    the record's own max_tokens); ``steady``: :func:`steady_window`'s rates."""
    ok = [r for r in records if r["ok"]]
    lat = [r["latency_s"] for r in ok]
    out_tokens = sum(r["completion_tokens"] or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in records:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    r3 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "short_outputs": sum(1 for r in ok if (r["completion_tokens"] or 0) < r.get("max_tokens", max_tokens)),
        "missing_usage": sum(1 for r in ok if r["completion_tokens"] is None),
        "output_tokens": out_tokens,
        "wall_s": round(wall_s, 6),
        "output_tokens_per_s": round(out_tokens / wall_s, 2) if wall_s > 0 else None,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "latency_s": {
            "p50": r3(percentile(lat, 50)),
            "p90": r3(percentile(lat, 90)),
            "p99": r3(percentile(lat, 99)),
            "mean": r3(sum(lat) / len(lat)) if lat else None,
            "max": r3(max(lat)) if lat else None,
        },
        "truncated": truncated,
        "steady": steady_window(records, wall_s, concurrency=concurrency, min_window_s=min_window_s),
    }


async def _one(session, url: str, body: dict, timeout_s: float, headers: dict | None = None) -> dict:
    import aiohttp

    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await resp.read()
            latency = time.perf_counter() - t0
            if resp.status != 200:
                return {"ok": False, "latency_s": latency, "completion_tokens": None, "error": f"http_{resp.status}"}
            try:
                data = json.loads(raw)
            except ValueError:
                return {"ok": False, "latency_s": latency, "completion_tokens": None, "error": "bad_json"}
            usage = data.get("usage") or {}
            return {"ok": True, "latency_s": latency, "completion_tokens": usage.get("completion_tokens"), "error": None}
    except asyncio.TimeoutError:
        return {"ok": False, "latency_s": time.perf_counter() - t0, "completion_tokens": None, "error": "timeout"}
    except aiohttp.ClientError as exc:
        return {"ok": False, "latency_s": time.perf_counter() - t0, "completion_tokens": None, "error": type(exc).__name__}


async def run_level(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    prompt_set: list[str],
    temperature: float = 1.0,
    like_proxy: bool = False,
    warmup: int = 0,
    level_timeout_s: float = 120.0,
    request_timeout_s: float = 120.0,
    spread: float = 0.0,
    headers: dict | None = None,
) -> dict:
    """Run one concurrency level; returns :func:`summarise`'s record. ``headers``: sent with every request."""
    import aiohttp

    url = base_url.rstrip("/") + "/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(warmup):  # not measured: connection set-up, first-request compiles
            await _one(session, url, request_body(model, prompt_set[i % len(prompt_set)], max_tokens,
                                                  temperature=temperature, like_proxy=like_proxy), request_timeout_s, headers)
        records: list[dict] = []
        next_i = 0
        deadline = time.perf_counter() + level_timeout_s
        truncated = False

        async def worker() -> None:
            nonlocal next_i, truncated
            while True:
                if next_i >= requests:
                    return
                if time.perf_counter() >= deadline:
                    truncated = True
                    return
                i = next_i
                next_i += 1
                n = max_tokens_for(i, max_tokens, spread)
                body = request_body(model, prompt_set[i % len(prompt_set)], n,
                                    temperature=temperature, like_proxy=like_proxy)
                t_start = time.perf_counter() - t0
                record = await _one(session, url, body, request_timeout_s, headers)
                record["t_end"] = time.perf_counter() - t0
                record["t_start"] = t_start
                record["max_tokens"] = n
                records.append(record)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return summarise(records, wall, concurrency=concurrency, max_tokens=max_tokens, truncated=truncated)


async def first_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id that ``/v1/models`` lists."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(base_url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            r.raise_for_status()
            data = await r.json(content_type=None)
    ids = [m["id"] for m in data.get("data", [])]
    if not ids:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return ids[0]


async def run(
    base_url: str,
    *,
    levels: list[int],
    requests: int,
    max_tokens: int,
    model: str | None = None,
    label: str = "",
    temperature: float = 1.0,
    like_proxy: bool = False,
    warmup: int = 2,
    level_timeout_s: float = 120.0,
    request_timeout_s: float = 120.0,
    prompt_count: int = 64,
    prompt_words: int = 48,
    requests_for=None,
    progress=None,
    spread: float = 0.0,
    headers: dict | None = None,
    gpu: bool = False,
) -> dict:
    """Every level in turn against ``base_url``; the whole result as one JSON-ready dict.

    ``requests_for(c)``, when given, sets the number of requests of level ``c`` (else ``requests``). ``gpu``: the
    server runs on this machine; each level records how busy its GPU was (bench/gpu_busy.py) under ``gpu``.
    """
    count = requests_for or (lambda c: requests)
    model = model or await first_model(base_url)
    ps = prompts(prompt_count, prompt_words)
    out = {
        "label": label,
        "base_url": base_url,
        "model": model,
        "params": {
            "requests_per_level": {str(c): count(c) for c in levels}, "max_tokens": max_tokens,
            "max_tokens_spread": spread, "ignore_eos": True,
            "temperature": temperature, "like_proxy": like_proxy, "warmup": warmup,
            "level_timeout_s": level_timeout_s, "prompts": prompt_count, "prompt_words": prompt_words,
            "headers": headers or {},
        },
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "levels": [],
    }
    for c in levels:
        sampler = gpu_busy.Sampler() if gpu else None
        if sampler:
            sampler.start()
        m0, t0 = _machine(), time.monotonic()
        res = await run_level(
            base_url, model, concurrency=c, requests=count(c), max_tokens=max_tokens, prompt_set=ps,
            temperature=temperature, like_proxy=like_proxy, warmup=warmup,
            level_timeout_s=level_timeout_s, request_timeout_s=request_timeout_s, spread=spread, headers=headers,
        )
        m1, wall = _machine(), time.monotonic() - t0
        if m0 and m1:  # the machine's CPU over the level: busy, and steal (the hypervisor's; bench/proc_cpu.py)
            res["machine"] = proc_cpu.machine_window(m0, m1, wall)
        if sampler:
            res["gpu"] = sampler.stop(responses=res["ok"] or None, wall_s=wall)
        out["levels"].append(res)
        if progress:
            progress(
                f"[loadgen {label or base_url}] c={c}: {res['ok']}/{res['requests']} ok, "
                f"{res['output_tokens_per_s']} tok/s, p50 {res['latency_s']['p50']} s, p99 {res['latency_s']['p99']} s"
                + (f", errors {res['error_kinds']}" if res["errors"] else "") + (" (truncated)" if res["truncated"] else "")
                + (f", steady {res['steady']['output_tokens_per_s']} tok/s"
                   if res["steady"]["output_tokens_per_s"] is not None else "")
                + (f", steal {res['machine']['steal_cores']} cores" if "machine" in res else "")
                + (f", {gpu_busy.line(res['gpu'])}" if "gpu" in res else "")
            )
    return out


def _machine() -> dict | None:
    """proc_cpu's machine snapshot, or None where /proc/stat cannot be read (not Linux)."""
    try:
        return proc_cpu.machine_snapshot()
    except (OSError, ValueError):
        return None


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"loadgen: --concurrency {text!r} is not a comma list of integers; e.g. 1,8,32,64") from None
    if not levels or any(c < 1 for c in levels):
        raise SystemExit(f"loadgen: --concurrency {text!r} needs positive integers; e.g. 1,8,32,64")
    return levels


def configure(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 (no /v1)")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--concurrency", default="1,8,32,64", help="comma list of levels (default 1,8,32,64)")
    ap.add_argument("--requests", type=int, default=128, help="requests per level (default 128)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    ap.add_argument("--max-tokens-spread", type=float, default=0.0, metavar="S",
                    help="spread output lengths: request i asks for a seeded uniform draw from "
                         "[M(1-S), M(1+S)], M = --max-tokens (default 0: all equal)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (Trinity's default is 1.0)")
    ap.add_argument("--like-proxy", action="store_true", help="also ask for logprobs and token ids, as Trinity's proxy does")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each level (default 2)")
    ap.add_argument("--level-timeout", type=float, default=120.0, help="no new request after this many seconds per level")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--label", default="", help="name of this target in the results")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    ap.add_argument("--json", action="store_true", help="print the JSON result instead of progress lines")
    ap.add_argument("--gpu-busy", action="store_true",
                    help="the server runs on this machine: record how busy its GPU was in each level (NVML)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(ap)
    args = ap.parse_args(argv)
    levels = parse_levels(args.concurrency)
    if args.requests < 1 or args.max_tokens < 1:
        print("loadgen: --requests and --max-tokens must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.max_tokens_spread < 1:
        print(f"loadgen: --max-tokens-spread {args.max_tokens_spread} must be at least 0 and below 1; "
              "e.g. 0.75 for lengths between M/4 and 7M/4", file=sys.stderr)
        return 2
    say = None if args.json else (lambda m: print(m, flush=True))
    try:
        result = asyncio.run(run(
            args.base_url, levels=levels, requests=args.requests, max_tokens=args.max_tokens, model=args.model,
            label=args.label, temperature=args.temperature, like_proxy=args.like_proxy, warmup=args.warmup,
            level_timeout_s=args.level_timeout, request_timeout_s=args.request_timeout, progress=say,
            spread=args.max_tokens_spread, gpu=args.gpu_busy,
        ))
    except (OSError, RuntimeError) as exc:
        print(f"loadgen: cannot reach {args.base_url} ({exc}); start the server or fix --base-url", file=sys.stderr)
        return 1
    except Exception as exc:  # aiohttp's client errors on /v1/models
        if type(exc).__module__.startswith("aiohttp"):
            print(f"loadgen: {args.base_url}/v1/models failed ({exc}); start the server or fix --base-url", file=sys.stderr)
            return 1
        raise
    text = json.dumps(result, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    failed = sum(lv["errors"] for lv in result["levels"])
    return 0 if failed == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
