#!/usr/bin/env python3
"""What patches/trinity-engine-anyio-root.patch saves Trinity's engine API server per response, on any machine, and
how far the patched server in a Ray actor stands from the same server as `vllm serve` runs it.

Usage:
    PYTHONPATH=python python bench/anyio_root.py --out FILE.json [--rounds 3] [--requests 2000] [--concurrency 32]
                                                 [--no-warm-up]

Trinity's engine API server as its engine actor runs it (bench/anyio_root_probe.py: a real Ray async actor on an own
loopback Ray head, the installed Trinity's run_server_worker_in_ray, vLLM's serve_http and load_aware_call), in front of
a TEST DOUBLE app that answers at once (vLLM's engine needs a GPU), so what is measured is the server's own cost a
response, where the patch acts. Three servers, one after the other: ``on``, the actor with the patch on
(RFTSTACK_ENGINE_ANYIO_ROOT unset); ``off``, the actor with it off (=0, upstream); ``plain``, the same server in a plain
process on uvloop.run()'s loop in its main thread, as `vllm serve` runs its own (=0: upstream code). The order rotates
from round to round (round_order); one warm-up run of each first, not counted (--no-warm-up leaves it out, for a
quick check that the script works). Per run: requests/s at the client (closed loop,
--concurrency clients over HTTP/1.1, a new connection each), the worker threads anyio started, the CPU a request of
the server's loop thread and of its process (less the fixed work's), and the median CPU and wall time of a fixed piece
of pure-Python work the loop runs every 5 ms while the requests run (the probe's ``fixed_work``: does the same work
cost more on that loop under one server than another). Reported: each round's ratios on/off, on/plain and off/plain and their
medians. Nothing is asserted (speed is reported, not tested).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = HERE / "anyio_root_probe.py"
SERVERS = {"on": ("-", False), "off": ("0", False), "plain": ("0", True)}  # name: (the switch, a plain process)
RATIOS = (("on", "off"), ("on", "plain"), ("off", "plain"))


def run_probe(head, switch: str, requests: int, c: int, timeout: float = 900, plain: bool = False) -> dict:
    """One anyio_root_probe.py run: the server in a Ray actor on ``head``, or with ``plain`` in a plain process on
    uvloop.run() as `vllm serve` runs it. Its JSON line with ``rc``, its exit status; where it printed none, ``rc``
    and the end of its stderr (``stderr``)."""
    where = "plain" if plain else head.address
    out = subprocess.run([sys.executable, str(PROBE), where, switch, str(requests), str(c)], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, **head.env()})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"rc": out.returncode, "stderr": out.stderr.strip()[-3000:]}
    return {**json.loads(lines[-1]), "rc": out.returncode}


def measured(head, name: str, requests: int, c: int) -> dict:
    """run_probe's result for the server ``name`` (SERVERS), or this script's end with the probe's reason where it
    failed."""
    switch, plain = SERVERS[name]
    r = run_probe(head, switch, requests, c, plain=plain)
    if r["rc"] != 0 or "stderr" in r:
        raise SystemExit(f"anyio_root: the probe failed (exit {r['rc']}): {r.get('error') or r['stderr'][-1500:]}")
    return r


def round_order(i: int) -> list[str]:
    """The servers' order in round ``i`` (from 0): SERVERS' order turned by ``i``, so each server goes first in turn."""
    names = list(SERVERS)
    return names[i % len(names):] + names[:i % len(names)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="leave out the warm-up run of each server (for a quick check, not a measurement)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 1:
        print("anyio_root: --rounds, --requests and --concurrency must be at least 1", file=sys.stderr)
        return 2
    from rftstack.run import ray_head

    result: dict = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
                    "command": " ".join(sys.argv), "requests": args.requests, "concurrency": args.concurrency,
                    "warm_up": args.warm_up, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="anyio-root-") as tmp:
        head = ray_head.start(state_dir=Path(tmp), num_gpus=0, num_cpus=1)
        try:
            if args.warm_up:
                print("anyio_root: one warm-up run of each server (not counted)", flush=True)
                for name in SERVERS:
                    measured(head, name, max(50, args.requests // 10), args.concurrency)
            for i in range(args.rounds):
                order = round_order(i)
                rnd: dict = {"order": order}
                for name in order:
                    rnd[name] = r = measured(head, name, args.requests, args.concurrency)
                    print(f"anyio_root: round {i + 1} {name}: {r['requests_per_s']} requests/s, {r['threads']} worker "
                          f"threads for {r['calls']} background calls, loop thread {r['loop_thread_ms_per_request']} "
                          f"ms CPU a request, fixed work {r['fixed_work_cpu_us']} us CPU", flush=True)
                for a, b in RATIOS:
                    rnd[f"ratio_{a}_{b}"] = round(rnd[a]["requests_per_s"] / rnd[b]["requests_per_s"], 3)
                result["rounds"].append(rnd)
        finally:
            ray_head.stop(head, timeout=5, remove_temp=True)
    for a, b in RATIOS:
        result[f"median_ratio_{a}_{b}"] = statistics.median(r[f"ratio_{a}_{b}"] for r in result["rounds"])
    for name in SERVERS:
        for key, field in (("loop_thread_ms", "loop_thread_ms_per_request"), ("fixed_work_cpu_us", "fixed_work_cpu_us")):
            seen = [r[name][field] for r in result["rounds"] if r[name][field] is not None]  # none: no tick ran
            result[f"median_{key}_{name}"] = statistics.median(seen) if seen else None
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"anyio_root: requests/s, medians of {args.rounds} rounds: patch on / off {result['median_ratio_on_off']:.3f}, "
          f"on / plain {result['median_ratio_on_plain']:.3f}, off / plain {result['median_ratio_off_plain']:.3f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
