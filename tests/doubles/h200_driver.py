"""TEST DOUBLE for the NVIDIA driver, which a CPU machine does not have: runs `rftstack ARGS` in
this process with the doctor's GPU reader (`rftstack.doctor.checks.gpu.read`) answering as the
H200 host's NVML does (driver 580.159.04, CUDA 13.0, one NVIDIA H200, 143771 MiB).

Everything else stays real: the doctor's other checks, Trinity's own config check, the Ray head.
`bench/runner_startup.py` uses it so that serve's preflight passes on a CPU machine as it does on
the GPU host, and is timed in full.

Usage: PYTHONPATH=python python tests/doubles/h200_driver.py serve ...
"""

import sys

from rftstack import cli
from rftstack.doctor.checks import gpu

H200 = gpu.Gpu("NVIDIA H200", (9, 0), 143771, 143155)


def read() -> gpu.GpuInfo:
    return gpu.GpuInfo("580.159.04", (13, 0), (H200,), "test double: H200 host (NVML)")


if __name__ == "__main__":
    gpu.read = read
    sys.exit(cli.main(sys.argv[1:]))
