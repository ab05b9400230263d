"""Import cost of each Python process that a Trinity serve starts, with and without bytecode.

Every new process of the serve path (the runner, `trinity run`, Ray's Explorer actor, the vLLM
engine actor, vLLM's EngineCore and GPU worker) pays its imports again. For each, this runs a fresh
interpreter with ``python -X importtime -c "import MODULE"`` and reports the wall time, the
importtime total and the top-level packages that cost the most. Two bytecode states:

  pyc      the environment as installed (bytecode present if the installer compiled it)
  source   no usable bytecode: PYTHONPYCACHEPREFIX points at a new empty directory and
           PYTHONDONTWRITEBYTECODE=1, so every module is compiled from source, as on a host whose
           packages were installed with `pip install --no-compile` into a read-only location

    python bench/import_profile.py --out bench/results/imports-cpu.json [--repeat 2] [--states pyc,source]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# process -> the module its entry point imports (read from the code paths of `trinity run` serve mode)
PROCESSES = {
    "rftstack CLI (runner)": "rftstack.cli",
    "ray (driver side)": "ray",
    "trinity run (launcher)": "trinity.cli.launcher",
    "Explorer actor": "trinity.explorer.explorer",
    "vLLM engine actor (Trinity)": "trinity.common.models.vllm_model",
    "vLLM EngineCore": "vllm.v1.engine.core",
    "vLLM GPU worker": "vllm.v1.worker.gpu_worker",
    "bare `vllm serve` CLI": "vllm.entrypoints.cli.main",
}

_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


def parse_importtime(stderr: str) -> dict:
    """From ``-X importtime`` output: the total (sum of the top-level entries' cumulative times) and
    each distribution's own share (sum of the *self* times of its modules, keyed by the first
    component of the module name), in microseconds."""
    own: dict[str, int] = {}
    total = 0
    modules = 0
    for line in stderr.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        self_us, cumulative, indent, name = int(m.group(1)), int(m.group(2)), len(m.group(3)), m.group(4)
        modules += 1
        if indent == 1:  # imported by the top level itself (not nested)
            total += cumulative
        pkg = name.split(".")[0]
        own[pkg] = own.get(pkg, 0) + self_us
    return {"total_us": total, "modules": modules, "by_package_us": dict(sorted(own.items(), key=lambda kv: -kv[1]))}


def profile(module: str, *, state: str, python: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
    tmp = None
    if state == "source":
        tmp = tempfile.mkdtemp(prefix="pyc-empty-")
        env["PYTHONPYCACHEPREFIX"] = tmp
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    t0 = time.monotonic()
    r = subprocess.run([python, "-X", "importtime", "-c", f"import {module}"], env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if tmp:
        os.rmdir(tmp)  # nothing was written into it
    parsed = parse_importtime(r.stderr)
    err = None if r.returncode == 0 else r.stderr.strip().splitlines()[-1][:300]
    return {"wall_s": round(wall, 2), "importtime_s": round(parsed["total_us"] / 1e6, 2), "modules": parsed["modules"],
            "rc": r.returncode, "error": err,
            "own_s": {k: round(v / 1e6, 2) for k, v in list(parsed["by_package_us"].items())[:10]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=2, help="runs per process and state; the minimum is reported")
    ap.add_argument("--states", default="pyc,source")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", default=None, help="comma list of modules (default: every process's)")
    args = ap.parse_args(argv)
    procs = PROCESSES if not args.only else {m: m for m in args.only.split(",")}
    result = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "command": " ".join([sys.executable, *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "processes": {}}
    for name, mod in procs.items():
        row = {"module": mod}
        for state in args.states.split(","):
            runs = [profile(mod, state=state, python=args.python) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            best["runs_wall_s"] = [r["wall_s"] for r in runs]
            row[state] = best
            print(f"[import_profile] {name} ({mod}) {state}: {best['wall_s']} s wall, {best['importtime_s']} s importtime"
                  + (f" ERROR {best['error']}" if best["error"] else ""), flush=True)
        result["processes"][name] = row
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
