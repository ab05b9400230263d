#!/usr/bin/env python3
"""What patches/trinity-engine-anyio-root.patch saves Trinity's engine API server per response, on any machine.

Usage:
    PYTHONPATH=python python bench/anyio_root.py --out FILE.json [--rounds 3] [--requests 2000] [--concurrency 32]

Trinity's engine API server as its engine actor runs it (bench/anyio_root_probe.py: a real Ray async actor on an own
loopback Ray head, the installed Trinity's run_server_worker_in_ray, vLLM's serve_http and load_aware_call), in front of
a TEST DOUBLE app that answers at once (vLLM's engine needs a GPU), so what is measured is the server's own cost a
response, where the patch acts: with the patch on (RFTSTACK_ENGINE_ANYIO_ROOT unset) and off (=0, upstream), one after
the other, the order alternating between rounds, one warm-up pair first not counted. Per run: requests/s at the client
(closed loop, --concurrency clients over HTTP/1.1, a new connection each), the worker threads anyio started. Reported:
the ratio on/off of each round and their median. Nothing is asserted (speed is reported, not tested).
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
SWITCHES = {"on": "-", "off": "0"}


def run_probe(head, switch: str, requests: int, c: int, timeout: float = 900) -> dict:
    """One anyio_root_probe.py run against ``head``: its JSON line with ``rc``, its exit status; where it printed
    none, ``rc`` and the end of its stderr (``stderr``)."""
    out = subprocess.run([sys.executable, str(PROBE), head.address, switch, str(requests), str(c)], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, **head.env()})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"rc": out.returncode, "stderr": out.stderr.strip()[-3000:]}
    return {**json.loads(lines[-1]), "rc": out.returncode}


def measured(head, switch: str, requests: int, c: int) -> dict:
    """run_probe's result, or this script's end with the probe's reason where it failed."""
    r = run_probe(head, switch, requests, c)
    if r["rc"] != 0 or "stderr" in r:
        raise SystemExit(f"anyio_root: the probe failed (exit {r['rc']}): {r.get('error') or r['stderr'][-1500:]}")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 1:
        print("anyio_root: --rounds, --requests and --concurrency must be at least 1", file=sys.stderr)
        return 2
    from rftstack.run import ray_head

    result: dict = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
                    "command": " ".join(sys.argv), "requests": args.requests, "concurrency": args.concurrency,
                    "rounds": []}
    with tempfile.TemporaryDirectory(prefix="anyio-root-") as tmp:
        head = ray_head.start(state_dir=Path(tmp), num_gpus=0, num_cpus=1)
        try:
            print("anyio_root: warm-up pair (not counted)", flush=True)
            for name in ("on", "off"):
                measured(head, SWITCHES[name], max(50, args.requests // 10), args.concurrency)
            for i in range(args.rounds):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                rnd: dict = {"order": list(order)}
                for name in order:
                    rnd[name] = measured(head, SWITCHES[name], args.requests, args.concurrency)
                    print(f"anyio_root: round {i + 1} {name}: {rnd[name]['requests_per_s']} requests/s, "
                          f"{rnd[name]['threads']} worker threads for {rnd[name]['calls']} background calls", flush=True)
                rnd["ratio_on_off"] = round(rnd["on"]["requests_per_s"] / rnd["off"]["requests_per_s"], 3)
                result["rounds"].append(rnd)
        finally:
            ray_head.stop(head, timeout=5, remove_temp=True)
    result["median_ratio_on_off"] = statistics.median(r["ratio_on_off"] for r in result["rounds"])
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"anyio_root: patch on / off: {result['median_ratio_on_off']:.3f} (median of {args.rounds} rounds) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
