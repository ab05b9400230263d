"""How long `rftstack doctor` takes on the installed stack, against `python -c "import vllm"`.

Usage: python bench/doctor_bench.py [--runs 5] [--config CFG] [--python PY]
Runs each command --runs times side by side (interleaved, so machine load hits all alike), prints
the median wall time of each and the ratio to the `import vllm` baseline. Without --config a tiny
model and the report's config (with max_model_len) are written to a temporary directory, so the
`-c` case (which runs Trinity's own validation in a subprocess) is measured too.
Goal: the doctor without -c under 3 s median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd, env) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--config")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as tmp:
        cfg = args.config
        if cfg is None:
            print("writing a tiny model and the report's config ...", file=sys.stderr, flush=True)
            model = Path(tmp) / "tiny"
            subprocess.run([args.python, "-c", f"from rftstack.run import tinymodel; tinymodel.ensure({str(model)!r})"],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cfg = str(Path(tmp) / "report.yaml")
            subprocess.run([args.python, "-m", "rftstack", "example-config", str(model), "--max-model-len", "2048",
                            "--checkpoint-root-dir", str(Path(tmp) / "ckpt"), "-o", cfg],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cases = {
            "rftstack doctor": [args.python, "-m", "rftstack", "doctor"],
            "rftstack doctor -c": [args.python, "-m", "rftstack", "doctor", "-c", cfg],
            "python -c 'import vllm'": [args.python, "-c", "import vllm"],
            "python -c 'import trinity.common.config' (config subprocess floor)": [args.python, "-c", "import trinity.common.config"],
        }
        times = {k: [] for k in cases}
        for i in range(args.runs):
            for name, cmd in cases.items():
                times[name].append(timed(cmd, env))
            print(f"run {i + 1}/{args.runs}: " + ", ".join(f"{k.split(' (')[0]} {v[-1]:.2f}s" for k, v in times.items()), file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["python -c 'import vllm'"]
    print(f"median of {args.runs} runs (s), ratio to `import vllm`:")
    for k, m in med.items():
        print(f"  {m:7.2f}  x{m / base:5.2f}  {k}")
    goal = med["rftstack doctor"] < 3.0
    print(f"goal: `rftstack doctor` under 3 s median: {'met' if goal else 'NOT met'}")
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
