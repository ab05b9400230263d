#!/usr/bin/env python3
"""What runs while a server's start-up log is silent? Stack samples of every Python process.

Usage:
    python bench/silent_gap.py --out DIR --ready-url URL [--timeout S] [--min-gap S] -- CMD [ARG...]
    python bench/silent_gap.py --analyze DIR --time-in REGEX [--time-in REGEX ...]

Runs CMD (its own process group) with bench/stack_sampler on PYTHONPATH, so every Python process
it starts samples its main thread's stack every 0.5 s into DIR/stacks/<pid>.jsonl; stamps each line
CMD prints with the wall clock (DIR/log.txt); polls URL until it answers 200 (the server is ready),
then stops the group (rftstack's supervisor: SIGINT, SIGTERM after 30 s, SIGKILL). Nothing is
left running.

Then, for each silent interval of the start-up log longer than --min-gap (default 5 s; between
consecutive output lines, before ready), it reports per process the stacks sampled in it,
collapsed to their innermost frames (import machinery left out, so an import shows as the
imported module's `<module>` line) and counted: DIR/gaps.json, and a
summary on stdout. Used on the GPU host for the unlogged gap after vLLM's "init engine ... took"
line (docs/benchmarks.md, section 2); runs anywhere (tests/bench/test_bench_silent_gap.py).

--analyze DIR reads an earlier run's DIR/stacks without running anything: for each --time-in
REGEX (matched against each sampled frame, e.g. 'block_pool.py:\\d+ __init__'), the wall time each
process spent with such a frame on its main thread's stack: from the sample before the first
match to the first sample without it, per run of matching samples (+-1 interval at each end;
samples x interval is also given, and undercounts while a loop holds the GIL).
That answers "how long did X take" where X logs nothing, for runs whose own log is too coarse to
show the gap (rftstack serve's 10 s progress lines).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from rftstack.run import supervisor  # noqa: E402

LIBDIR = re.compile(r".*/(?:site|dist)-packages/|.*/lib/python3\.\d+/")
SAMPLER = Path(__file__).resolve().parent / "stack_sampler"


def run(cmd: list[str], out: Path, ready_url: str, timeout: float) -> dict:
    """Start CMD with the sampler, stamp its output, wait for READY_URL, stop it; the run's facts."""
    stacks = out / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RFTSTACK_STACK_SAMPLES=str(stacks), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SAMPLER), env.get("PYTHONPATH", "")) if p)
    lines: list[tuple[float, str]] = []
    log = open(out / "log.txt", "w")  # noqa: SIM115 (closed once the pump has ended)

    def stamp(line: str) -> None:
        now = time.time()
        lines.append((now, line))
        log.write(f"{now:.3f} {line}\n")
        log.flush()

    t0 = time.time()
    proc, pump = supervisor.spawn(cmd, env=env, sink=stamp)
    ready_t = None
    try:
        while time.time() - t0 < timeout and proc.poll() is None:
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as r:
                    if r.status == 200:
                        ready_t = time.time()
                        break
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        # SIGINT to its group, SIGTERM after 30 s, SIGKILL 10 s later; returns when none is left
        supervisor.stop(tag=None, pgid=proc.pid, first=signal.SIGINT, grace_s=30, keep_reaping=[proc.pid], leader=proc.pid)
        proc.wait()
        pump.join(timeout=10)
        log.close()
    return {"cmd": cmd, "start": t0, "ready": ready_t, "ready_s": None if ready_t is None else round(ready_t - t0, 1),
            "exit": proc.returncode, "lines": lines}


def silent_gaps(lines: list[tuple[float, str]], start: float, end: float | None, min_gap: float) -> list[tuple[float, float]]:
    """Intervals longer than MIN_GAP with no output line, from START to END (ready, else the last line)."""
    stamps = [start] + [t for t, _ in lines if end is None or t <= end]
    if end is not None:
        stamps.append(end)
    return [(a, b) for a, b in zip(stamps, stamps[1:]) if b - a > min_gap]


def short(frame: str) -> str:
    """'…/site-packages/vllm/v1/engine/core.py:132 __init__' -> 'vllm/v1/engine/core.py:132 __init__'."""
    path, _, rest = frame.partition(":")
    return f"{LIBDIR.sub('', path)}:{rest}"


def load_samples(stacks: Path) -> dict[int, list[dict]]:
    samples = {}
    for f in sorted(stacks.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        title = ""
        for row in rows:
            title = row["title"] = row.get("title", title)
        samples[int(f.stem)] = rows
    return samples


def in_gap(samples: dict[int, list[dict]], gap: tuple[float, float], depth: int) -> list[dict]:
    """Per process with samples in GAP: its title and its stacks (innermost DEPTH frames) counted."""
    a, b = gap
    found = []
    for pid, rows in samples.items():
        window = [r for r in rows if a <= r["t"] <= b and r["stack"]]
        if not window:
            continue
        counts = collections.Counter(
            " <- ".join([short(f) for f in r["stack"][::-1] if not f.startswith("<frozen ")][:depth]) for r in window)
        found.append({"pid": pid, "title": window[-1]["title"], "samples": len(window),
                      "top": [{"n": n, "stack": s} for s, n in counts.most_common(8)]})
    return sorted(found, key=lambda p: -p["samples"])


def time_in(samples: dict[int, list[dict]], pattern: str) -> list[dict]:
    """Per process: seconds with a frame matching PATTERN on the stack (samples x median interval)."""
    rx = re.compile(pattern)
    found = []
    for pid, rows in samples.items():
        hits = [r for r in rows if any(rx.search(f) for f in r["stack"])]
        if not hits:
            continue
        steps = sorted(b["t"] - a["t"] for a, b in zip(rows, rows[1:]))
        interval = steps[len(steps) // 2] if steps else 0.5
        # wall time of each run of consecutive matching samples (the sampler thread needs the GIL, so
        # under a GIL-holding loop samples come late and samples x interval undercounts)
        span, run_start, prev = 0.0, None, None
        for r in rows:
            hit = any(rx.search(f) for f in r["stack"])
            if hit and run_start is None:
                run_start = prev["t"] if prev else r["t"]
            if not hit and run_start is not None:
                span, run_start = span + (r["t"] - run_start), None
            prev = r
        if run_start is not None:
            span += rows[-1]["t"] - run_start
        found.append({"pid": pid, "title": hits[-1]["title"], "samples": len(hits), "seconds": round(len(hits) * interval, 1),
                      "wall_s": round(span, 1), "first_t": hits[0]["t"], "last_t": hits[-1]["t"]})
    return sorted(found, key=lambda p: -p["seconds"])


def analyze(out: Path, patterns: list[str]) -> int:
    samples = load_samples(out / "stacks")
    if not samples:
        print(f"silent_gap: no stack samples under {out / 'stacks'}; give the --out directory of an earlier run", file=sys.stderr)
        return 2
    result = {p: time_in(samples, p) for p in patterns}
    (out / "time-in.json").write_text(json.dumps(result, indent=1))
    for p, procs in result.items():
        print(f"{p!r}: " + ("; ".join(f"pid {q['pid']} ({q['title'][:40]}) {q['wall_s']} s wall, {q['samples']} samples" for q in procs) or "not sampled"))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ready-url")
    ap.add_argument("--analyze", type=Path, metavar="DIR", help="only analyse an earlier run's DIR/stacks (see --time-in)")
    ap.add_argument("--time-in", action="append", default=[], metavar="REGEX", help="with --analyze: seconds per process with a matching frame")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--min-gap", type=float, default=5.0)
    ap.add_argument("--depth", type=int, default=6, help="innermost frames kept per stack (default 6)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.analyze:
        if not args.time_in:
            ap.error("--analyze needs at least one --time-in REGEX, e.g. --time-in 'block_pool.py:\\d+ __init__'")
        return analyze(args.analyze, args.time_in)
    if not (args.out and args.ready_url):
        ap.error("--out and --ready-url are needed to run a command (or use --analyze DIR)")
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given: put it after --, e.g. -- vllm serve MODEL")
    args.out.mkdir(parents=True, exist_ok=True)
    r = run(cmd, args.out, args.ready_url, args.timeout)
    samples = load_samples(args.out / "stacks")
    gaps = []
    for a, b in silent_gaps(r["lines"], r["start"], r["ready"], args.min_gap):
        before = next((line for t, line in reversed(r["lines"]) if t <= a), "(start)")
        after = next((line for t, line in r["lines"] if t >= b), "(ready)" if r["ready"] else "(end)")
        gaps.append({"from_s": round(a - r["start"], 1), "seconds": round(b - a, 1), "after_line": before[-300:],
                     "before_line": after[-300:], "processes": in_gap(samples, (a, b), args.depth)})
    result = {k: v for k, v in r.items() if k != "lines"} | {"processes_sampled": len(samples), "gaps": gaps}
    (args.out / "gaps.json").write_text(json.dumps(result, indent=1))
    print(f"ready after {r['ready_s']} s; {len(samples)} Python processes sampled; {len(gaps)} silent gaps over {args.min_gap} s")
    for g in gaps:
        print(f"\n+{g['from_s']} s: {g['seconds']} s silent after: {g['after_line'][-160:]}")
        for p in g["processes"][:4]:
            print(f"  pid {p['pid']} ({p['title'][:60]}), {p['samples']} samples:")
            for t in p["top"][:3]:
                print(f"    {t['n']:4d}  {t['stack'][:400]}")
    return 0 if r["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
