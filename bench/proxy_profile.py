"""Where the proxy process spends its time: py-spy attached to Trinity's real proxy (the same child
as bench/proxy_overhead.py: real app, real ExplorerService.record_experience, real recorder, in
front of the TEST DOUBLE upstream) while a closed loop of ``--concurrency`` clients drives it.

Per variant: (1) ``--warmup-s`` of load; (2) ``--baseline-s`` of load WITHOUT the profiler: responses
and the proxy's CPU seconds from /proc (process total, main thread, the rest = aiosqlite worker
threads), i.e. CPU ms per response unperturbed; (3) ``py-spy record --pid PID --format raw
--threads --full-filenames`` for ``--duration-s`` (sampling pauses the process: throughput in that
window is reported too). Written: the collapsed stacks (paths shortened to the package, identical
stacks merged, thread ids dropped) and a JSON summary.

Categories: each sample gets exactly one. Its frames are walked from the leaf towards the root; the
first frame that matches a category's rule (RULES) decides (so json.dumps under starlette is "JSON",
and starlette's own frames are "FastAPI/starlette"). Frames of modules without a rule (asyncio,
selectors, h11, anyio, threading, contextlib, numpy, ...) are passed over, so h11 parsing under
uvicorn counts as uvicorn and h11 under httpcore as httpx; a sample with nothing but such frames is
"asyncio event loop + socket I/O" when it has asyncio/selectors frames, else "other". With ``--native`` C frames
are sampled too and the aiosqlite worker threads' waits are told apart (sqlite's busy handler
sleeping on another connection's lock, fdatasync, journal unlink, waiting for work).

CPU ms per response of a category = its share of the MAIN thread's busy samples (all but those in
epoll_wait, which py-spy does not always drop as idle) x the main thread's CPU ms per response
(baseline window); the aiosqlite worker threads' CPU is measured separately
(their samples are mostly waits, not CPU: see --native).

    python bench/proxy_profile.py --out bench/results/proxy-profile-cpu.json \\
        [--variants sqlite,hop] [--concurrency 32] [--duration-s 20] [--rate 100] [--native] [--py-spy 'uvx py-spy']
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import loadgen
import proc_cpu
import proxy_overhead as po

PY_SPY_FIX = ("py-spy is not available; install it (`uv tool install py-spy` or `pip install py-spy`) "
              "or pass --py-spy 'uvx py-spy'")

# (category, path prefixes or files, function-name regex or None); checked per frame, leaf first.
# Native-only frames (C functions, --native) come first: they are leaves under the Python frames.
RULES: list[tuple[str, tuple[str, ...], str | None]] = [
    ("sqlite busy wait (usleep: another connection holds the lock)", ("@native",), r"^(usleep|nanosleep|clock_nanosleep)$"),
    ("sqlite fdatasync/fsync", ("@native",), r"^(fdatasync|fsync)$"),
    ("sqlite journal create/unlink", ("@native",), r"^(unlink|unlinkat|openat|open64)$"),
    ("aiosqlite worker waiting for work", ("@native",), r"SimpleQueue_get"),
    ("logging (uvicorn access log, Trinity get_logger)", ("logging/", "uvicorn/logging.py", "trinity/utils/log.py"), None),
    ("Experience serialization (safetensors + pickle)", ("safetensors/",), None),
    ("Experience serialization (safetensors + pickle)", ("trinity/common/experience.py",), r"serializ"),
    ("Experience build (torch tensors)", ("torch/", "trinity/common/experience.py", "trinity/explorer/proxy/service.py"), None),
    ("Trinity recorder glue (retry session, row classes)", ("trinity/buffer/", "trinity/explorer/proxy/recorder.py"), None),
    ("SQLAlchemy (ORM, core, async adaptation)", ("sqlalchemy/", "greenlet/"), None),
    ("aiosqlite/sqlite3 (incl. worker threads)", ("aiosqlite/", "sqlite3/"), None),
    ("httpx/httpcore forwarding", ("httpx/", "httpcore/"), None),
    ("uvicorn HTTP server (h11 parsing, transport)", ("uvicorn/",), None),
    ("FastAPI/starlette/pydantic routing", ("fastapi/", "starlette/", "pydantic/", "pydantic_core/"), None),
    ("JSON encode/decode (stdlib json)", ("json/",), None),
    ("Trinity proxy app (handlers)", ("trinity/explorer/proxy/app.py",), None),
]
# Stages of a recorded response (main thread), for ``stages``: the first frame from the leaf up that
# matches decides, so SQLAlchemy under the writer task counts as the group commit, and torch under
# serialize() as serialization. A collection of the garbage collector is charged to the stage whose
# allocation set it off (py-spy sees the Python frame): ``gc`` in the result times them apart.
STAGES: list[tuple[str, str, str]] = [
    ("experience serialization (safetensors + pickle)", "trinity/common/experience.py", r"serializ"),
    ("group commit: rows, SQL, commit (writer task)", "trinity/explorer/proxy/recorder.py", r"_write_queued|_commit_batch"),
    ("queueing for the group commit", "trinity/explorer/proxy/recorder.py", r"record_history|_record_grouped"),
    ("experience build (torch tensors)", "trinity/explorer/proxy/service.py", r"record_experience"),
    ("parsing the engine's answer (orjson)", "trinity/explorer/proxy/app.py", r"^_fast_loads$"),
    ("forwarding to the engine (aiohttp)", "trinity/explorer/proxy/app.py", r"^_fast_post$"),
    ("chat_completions: request rewrite, response, headers", "trinity/explorer/proxy/app.py", r"."),
]
STAGE_REST = "HTTP server, routing, event loop (outside chat_completions)"


def stage(frames: list[str]) -> str:
    """The stage of one main-thread sample (frames root first)."""
    for frame in reversed(frames):
        func, path = parse_frame(frame)
        for name, file, func_re in STAGES:
            if path == file and re.search(func_re, func):
                return name
    return STAGE_REST


def stages_ms(stacks: list[tuple[list[str], int]], base: dict) -> dict:
    """CPU ms per response by stage: main-thread busy samples (epoll_wait left out) x main-thread ms/response."""
    counts: Counter = Counter()
    for frames, n in stacks:
        root = frames[0] if frames and frames[0].startswith(("thread (", "thread: ")) else ""
        rest = frames[1:] if root else frames
        if thread_kind(root) != "main" or categorise(rest) == EPOLL:
            continue
        counts[stage(rest)] += n
    busy, per = sum(counts.values()), base.get("cpu_ms_per_response_main") or 0.0
    return {k: round(v / busy * per, 3) for k, v in counts.most_common()} if busy else {}


LOOP = "asyncio event loop + socket I/O"
EPOLL = "event loop in epoll_wait (mostly idle: waiting for the DB or upstream)"
OTHER = "other"
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short_path(path: str) -> str:
    """A frame's file, from its package on: ``.../site-packages/httpx/_client.py`` -> ``httpx/_client.py``."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    m = re.search(r"/lib/python\d+\.\d+/(.*)$", path)
    if m:
        return m.group(1)
    m = re.search(r"/(bench/[^/]+\.py)$", path)
    return m.group(1) if m else path


def parse_frame(frame: str) -> tuple[str, str]:
    """(function, short path) of one py-spy frame ``func (path:line)``; native frames get path ``@native``."""
    m = FRAME.match(frame)
    if not m:
        return frame, ""
    path = m.group("file")
    if not path.endswith(".py"):
        return m.group("func"), "@native"
    return m.group("func"), short_path(path)


def thread_kind(root: str) -> str:
    """``thread (123): MainThread`` -> main; aiosqlite's connection threads -> aiosqlite; else other."""
    if root.startswith("thread: "):  # already normalised (the saved stacks)
        return root[len("thread: "):]
    if not root.startswith("thread ("):
        return "main"  # recorded without --threads: no thread frame
    if root.endswith("MainThread"):
        return "main"
    if "_connection_worker_thread" in root:
        return "aiosqlite"
    return "other"


def categorise(frames: list[str]) -> str:
    """The category of one sample (frames root first, as py-spy writes them)."""
    if frames:
        func, path = parse_frame(frames[-1])
        if (path == "selectors.py" and func == "EpollSelector.select") or (path == "@native" and func == "epoll_wait"):
            return EPOLL
    loop = False
    for frame in reversed(frames):
        func, path = parse_frame(frame)
        if not path:
            continue
        for name, prefixes, func_re in RULES:
            if any(path == p or path.startswith(p) for p in prefixes) and (func_re is None or re.search(func_re, func)):
                return name
        if path.startswith(("asyncio/", "selectors.py")):
            loop = True
    return LOOP if loop else OTHER


def read_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's raw format: ``frame;frame;... COUNT`` per line."""
    out = []
    for line in text.splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if stack and n.isdigit():
            out.append((stack.split(";"), int(n)))
    return out


def normalise(stacks: list[tuple[list[str], int]]) -> str:
    """Collapsed stacks with short paths and thread ids dropped (``thread: main|aiosqlite|other``), merged."""
    merged: Counter = Counter()
    for frames, n in stacks:
        root = frames[0] if frames and frames[0].startswith(("thread (", "thread: ")) else None
        rest = frames[1:] if root else frames
        out = [f"thread: {thread_kind(root or '')}"]
        for f in rest:
            func, path = parse_frame(f)
            m = FRAME.match(f)
            line = m.group("line") if m else None
            out.append(f"{func} ({path}:{line})" if path and path != "@native" and line else (f"{func} (native)" if path == "@native" else f))
        merged[";".join(out)] += n
    return "".join(f"{k} {v}\n" for k, v in sorted(merged.items(), key=lambda kv: -kv[1]))


def summarise(stacks: list[tuple[list[str], int]], top: int = 15) -> dict:
    """Sample counts by thread kind and by category (all threads, main thread), and the top self-time functions."""
    by_thread: Counter = Counter()
    cat_all: Counter = Counter()
    cat_thread: dict[str, Counter] = {}
    self_fn: Counter = Counter()
    for frames, n in stacks:
        root = frames[0] if frames and frames[0].startswith(("thread (", "thread: ")) else ""
        kind = thread_kind(root)
        rest = frames[1:] if root else frames
        by_thread[kind] += n
        c = categorise(rest)
        cat_all[c] += n
        cat_thread.setdefault(kind, Counter())[c] += n
        if rest:
            func, path = parse_frame(rest[-1])
            self_fn[f"{func} ({path or 'native'})"] += n
    total = sum(by_thread.values())

    def table(counter: Counter) -> dict:
        s = sum(counter.values())
        return {k: {"samples": v, "pct": round(100 * v / s, 2) if s else 0.0} for k, v in counter.most_common()}

    return {
        "samples": total,
        "samples_by_thread": dict(by_thread.most_common()),
        "categories_all_threads": table(cat_all),
        "categories_by_thread": {k: table(v) for k, v in cat_thread.items()},
        "top_self": [{"function": k, "samples": v, "pct": round(100 * v / total, 2) if total else 0.0}
                     for k, v in self_fn.most_common(top)],
    }


def cpu_split(pid: int) -> tuple[float, float]:
    """(process CPU s, main thread CPU s) from /proc: utime + stime."""
    return (proc_cpu.stat_ticks(Path(f"/proc/{pid}/stat").read_text()) / proc_cpu.TICK,
            proc_cpu.stat_ticks(Path(f"/proc/{pid}/task/{pid}/stat").read_text()) / proc_cpu.TICK)


class Load:
    """Closed loop of ``concurrency`` clients in a thread of this process; each completion's time, ok and
    latency kept. ``model``: the model to ask for (default: the first of /v1/models); ``like_proxy``: ask for
    logprobs and token ids, as Trinity's proxy does (loadgen.NUMERIC: with numeric logprobs)."""

    def __init__(self, base: str, concurrency: int, max_tokens: int, *, model: str | None = None,
                 like_proxy: bool | str = False) -> None:
        self.base, self.concurrency, self.max_tokens = base, concurrency, max_tokens
        self.model, self.like_proxy = model, like_proxy
        self.done: list[tuple[float, bool, float]] = []
        self.stop = False
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        import aiohttp

        model = self.model or await loadgen.first_model(self.base)
        url = self.base.rstrip("/") + "/v1/chat/completions"
        ps = loadgen.prompts()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.concurrency)) as s:
            async def worker(k: int) -> None:
                i = k
                while not self.stop:
                    body = loadgen.request_body(model, ps[i % len(ps)], self.max_tokens, temperature=1.0,
                                                like_proxy=self.like_proxy)
                    r = await loadgen._one(s, url, body, 60)
                    self.done.append((time.monotonic(), r["ok"], r["latency_s"]))
                    i += self.concurrency
            await asyncio.gather(*(worker(k) for k in range(self.concurrency)))

    def count(self, t0: float, t1: float) -> tuple[int, int]:
        xs = [ok for t, ok, _ in list(self.done) if t0 <= t < t1]
        return sum(xs), len(xs) - sum(xs)


def window(load: Load, pid: int, action) -> dict:
    c0, m0 = cpu_split(pid)
    t0 = time.monotonic()
    action()
    t1 = time.monotonic()
    c1, m1 = cpu_split(pid)
    ok, err = load.count(t0, t1)
    wall = t1 - t0
    return {"monotonic": [t0, t1], "wall_s": round(wall, 3), "responses": ok, "errors": err, "responses_per_s": round(ok / wall, 2),
            "cpu_s": round(c1 - c0, 3), "cpu_s_main": round(m1 - m0, 3), "cpu_s_other_threads": round(c1 - c0 - (m1 - m0), 3),
            "cpu_ms_per_response": round(1000 * (c1 - c0) / ok, 3) if ok else None,
            "cpu_ms_per_response_main": round(1000 * (m1 - m0) / ok, 3) if ok else None,
            "cpu_ms_per_response_other_threads": round(1000 * (c1 - c0 - (m1 - m0)) / ok, 3) if ok else None}


def ms_table(summary: dict, base: dict) -> dict:
    """CPU ms per response by category: main-thread shares x main-thread ms/response, plus the other threads' CPU.

    Samples in epoll_wait are not counted as CPU (py-spy does not always drop the idle main thread): the
    main thread's CPU is spread over its other samples."""
    main = summary["categories_by_thread"].get("main", {})
    per = base.get("cpu_ms_per_response_main") or 0.0
    busy = sum(v["pct"] for k, v in main.items() if k != EPOLL)
    out = {k: (0.0 if k == EPOLL or not busy else round(v["pct"] / busy * per, 3)) for k, v in main.items()}
    out["(aiosqlite worker + other threads: their measured CPU)"] = base.get("cpu_ms_per_response_other_threads")
    return out


def resolve_py_spy(spec: str | None) -> list[str] | None:
    if spec:
        argv = shlex.split(spec)
        return argv if argv and shutil.which(argv[0]) else None
    if shutil.which("py-spy"):
        return [shutil.which("py-spy")]
    if shutil.which("uvx"):
        r = subprocess.run(["uvx", "--offline", "py-spy", "--version"], capture_output=True, timeout=60, check=False)
        if r.returncode == 0:
            return ["uvx", "--offline", "py-spy"]
    return None


def py_spy_record(py_spy: list[str], pid: int, seconds: int, rate: int, raw: Path, *, native: bool = False,
                  nonblocking: bool = True) -> dict:
    """``py-spy record`` of ``pid`` into ``raw`` (collapsed stacks with thread ids and names, full paths): its
    command, exit status and last lines of stderr."""
    cmd = [*py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate), "--format", "raw",
           "--threads", "--full-filenames", "-o", str(raw)] + (["--native"] if native else []) + (["--nonblocking"] if nonblocking else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, check=False)
    return {"command": " ".join(cmd), "rc": p.returncode, "stderr_tail": (p.stderr or "").strip().splitlines()[-3:],
            "stdout_tail": (p.stdout or "").strip().splitlines()[-3:]}


def profile_variant(args, py_spy: list[str], url: str, variant: str, logs: Path, stacks_dir: Path, work: Path) -> dict:
    proxy, port = po.start_proxy(url, variant, work, logs)
    load = None
    try:
        po.wait_http(f"http://127.0.0.1:{port}/health", proxy, 300)
        load = Load(f"http://127.0.0.1:{port}", args.concurrency, args.max_tokens)
        load.thread.start()
        time.sleep(args.warmup_s)
        base = window(load, proxy.pid, lambda: time.sleep(args.baseline_s))
        raw = logs / f"raw-{variant}.txt"
        res: dict = {}

        def record() -> None:
            res["rec"] = py_spy_record(py_spy, proxy.pid, args.duration_s, args.rate, raw, native=args.native,
                                       nonblocking=args.nonblocking)
        prof = window(load, proxy.pid, record)
        rec = res["rec"]
        if rec["rc"] != 0 or not raw.exists():
            last = (rec["stderr_tail"] or rec["stdout_tail"])[-1:] or ["no output"]
            raise RuntimeError(f"py-spy could not record the proxy (pid {proxy.pid}): {last[0]}; it needs ptrace "
                               "(run as root, or set kernel.yama.ptrace_scope=0)")
    finally:
        if load:
            load.stop = True
            load.thread.join(timeout=90)
        po.stop(proxy)
    stacks = read_collapsed(raw.read_text())
    norm = normalise(stacks)
    out_stacks = stacks_dir / f"{variant}{'-native' if args.native else ''}{'-nonblocking' if args.nonblocking else ''}.collapsed.gz"
    out_stacks.write_bytes(gzip.compress(norm.encode(), mtime=0))
    s = summarise(stacks)
    gc_file = work / f"gc-{variant}.json"
    gc_events = json.loads(gc_file.read_text()) if gc_file.exists() else []
    for w in (base, prof):
        w["gc"] = po.gc_in_window(gc_events, *w.pop("monotonic"), w["responses"])
    return {"variant": variant, "baseline_no_profiler": base, "profiled_window": prof,
            "py_spy": {"command": rec["command"], "stderr_tail": rec["stderr_tail"]},
            "collapsed_stacks": str(out_stacks), "collapsed_stacks_bytes": len(norm.encode()),
            **s, "cpu_ms_per_response_by_category": ms_table(s, base),
            "cpu_ms_per_response_by_stage": stages_ms(stacks, base)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--stacks", default=None, help="directory for the collapsed stacks (default: next to --out)")
    ap.add_argument("--variants", default="sqlite,hop", help=f"from {', '.join(po.VARIANTS)} (optionally +quiet)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--baseline-s", type=float, default=8.0, help="load without the profiler: CPU ms per response")
    ap.add_argument("--duration-s", type=int, default=20, help="py-spy's recording time")
    ap.add_argument("--rate", type=int, default=100, help="samples/s (200 makes py-spy fall behind on 2 cores)")
    ap.add_argument("--native", action="store_true", help="sample C frames too (slower; tells sqlite's waits apart)")
    ap.add_argument("--nonblocking", action="store_true", help="py-spy does not pause the process (less perturbation, "
                    "occasional torn stacks; use with sqlite, whose many aiosqlite threads make pausing costly)")
    ap.add_argument("--py-spy", dest="py_spy", default=None, help="the py-spy command (default: py-spy on PATH, else uvx's cached one)")
    args = ap.parse_args(argv)
    if not args.out:
        print("proxy_profile: --out is required", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v]
    problem = po.variants_problem(variants or [""])  # none given: "unknown variant ''"
    if problem:
        print(f"proxy_profile: {problem}", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.duration_s < 1 or args.rate < 1 or args.baseline_s <= 0:
        print("proxy_profile: --concurrency, --duration-s, --rate and --baseline-s must be positive", file=sys.stderr)
        return 2
    py_spy = resolve_py_spy(args.py_spy)
    if py_spy is None:
        print(f"proxy_profile: {PY_SPY_FIX}", file=sys.stderr)
        return 2
    out = Path(args.out)
    stacks_dir = Path(args.stacks) if args.stacks else out.parent / (out.stem + "-stacks")
    stacks_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="proxy-profile-logs-"))
    work = Path(tempfile.mkdtemp(prefix="proxy-profile-"))
    result: dict = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
                    "command": " ".join([sys.executable, *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "upstream": "TEST DOUBLE (bench/openai_double.py)", "concurrency": args.concurrency,
                    "profiler": "py-spy (sampling, attached by pid; idle threads not sampled)",
                    "categorisation": "one category per sample: first matching frame from the leaf up; generic modules "
                                      "(no rule: asyncio, h11, anyio, threading, ...) are passed over; see RULES in bench/proxy_profile.py",
                    "runs": {}}
    double, url = po.start_double(logs)
    try:
        for v in variants:
            print(f"profiling {v} at c={args.concurrency} ...", flush=True)
            try:
                result["runs"][v] = profile_variant(args, py_spy, url, v, logs, stacks_dir, work)
            except RuntimeError as e:
                print(f"proxy_profile: {e}", file=sys.stderr)
                return 1
            out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        po.stop(double)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for v, r in result["runs"].items():
        print(f"\n{v}: {r['baseline_no_profiler']['responses_per_s']} resp/s, {r['baseline_no_profiler']['cpu_ms_per_response']} "
              f"CPU ms/resp (main {r['baseline_no_profiler']['cpu_ms_per_response_main']})")
        for k, ms in r["cpu_ms_per_response_by_category"].items():
            print(f"  {ms!s:>8} ms  {k}")
        print("  by stage:")
        for k, ms in r["cpu_ms_per_response_by_stage"].items():
            print(f"  {ms!s:>8} ms  {k}")
        print(f"  garbage collector, no profiler: {r['baseline_no_profiler']['gc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
