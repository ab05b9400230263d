"""Small helpers for the GPU tests: is there a GPU, its memory and processes, a JSON POST."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return out.returncode == 0 and any(l.startswith("GPU ") for l in out.stdout.splitlines())


def gpu_memory_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True)
    return sum(int(x) for x in out.stdout.split())


def memory_back_after(baseline_mib: int, limit_s: float, slack_mib: int = 512) -> float | None:
    """Seconds until the GPU's used memory is back within ``slack_mib`` of ``baseline_mib``
    (checked once a second for ``limit_s``, then once more); None if it never was."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and gpu_memory_used_mib() > baseline_mib + slack_mib:
        time.sleep(1)
    return time.monotonic() - t0 if gpu_memory_used_mib() <= baseline_mib + slack_mib else None


def gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True)
    return {int(x) for x in out.stdout.split() if x.strip().isdigit()}


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())
