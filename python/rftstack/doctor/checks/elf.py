"""Binaries against the driver: which CUDA major each installed CUDA extension was linked for.

The dynamic section (DT_NEEDED, DT_SONAME) of every shared object of torch, vllm, flashinfer,
triton and the nvidia-* libraries is read with pyelftools (headers only, nothing is loaded), and
the CUDA major is taken from the sonames of the CUDA runtime libraries they need
(``libcudart.so.13`` -> CUDA 13). A CUDA 13 binary under a driver that stops at 12.8 is the report's
problem 3 (``ImportError: libcudart.so.13``).
"""

from __future__ import annotations

import dataclasses

from rftstack.doctor.checks import gpu as gpu_check
from rftstack.findings import FAIL, INFO, OK, Finding
from rftstack.stack.elf import (  # noqa: F401 - the reading half lives in stack; names kept here for the check's callers
    CUDA_VERSIONED,
    WATCHED,
    WATCHED_PREFIXES,
    DistCuda,
    ElfLinks,
    cuda_major_of,
    read_links,
    scan,
    scan_dist,
    watched,
)


def _replacement(dist: str, policy) -> str:
    for a in getattr(policy, "artifacts", ()):
        if a.name.lower() == dist.lower():
            return f"{a.name} {a.version}"
    return ""


def check(found: list[DistCuda], max_cuda: tuple[int, int] | None, driver_version: str | None, policy=None) -> list[Finding]:
    """One finding per distribution with CUDA binaries (nvidia-* libraries folded into one)."""
    out = []
    nvidia = [d for d in found if d.dist.lower().startswith("nvidia-")]
    others = [d for d in found if d not in nvidia]
    for d in others:
        data = dataclasses.asdict(d)
        needs = f"{d.dist} {d.version} is built for CUDA {d.cuda_major} ({d.example} needs {d.lib})"
        if max_cuda is None:
            drv = gpu_check.min_driver_for_cuda((d.cuda_major, 0))
            out.append(Finding(f"elf.{d.dist}", INFO, f"{needs}; it needs driver >= {drv}, and no driver was found to compare.", "", data))
        elif d.cuda_major > max_cuda[0]:
            repl = _replacement(d.dist, policy)
            build = f"{repl} (policy.toml [cuda12])" if repl else f"the CUDA {max_cuda[0]} build of {d.dist}"
            out.append(Finding(
                f"elf.{d.dist}", FAIL,
                f"{needs}, but driver {driver_version} supports CUDA <= {gpu_check.fmt_cuda(max_cuda)}, so importing it fails with `ImportError: {d.lib}`.",
                f"Install {build}: `rftstack flavour cuda12` swaps it into this environment (or use the flake's default package, "
                f"`nix run .#serve`), or upgrade the driver to >= {gpu_check.min_driver_for_cuda((d.cuda_major, 0))}.",
                data,
            ))
        else:
            out.append(Finding(f"elf.{d.dist}", OK, f"{needs}, which driver {driver_version} (CUDA <= {gpu_check.fmt_cuda(max_cuda)}) runs.", "", data))
    if nvidia:
        top = max(d.cuda_major for d in nvidia)
        worst = [d for d in nvidia if d.cuda_major == top]
        names = ", ".join(f"{d.dist} {d.version}" for d in worst[:4]) + (f" and {len(worst) - 4} more" if len(worst) > 4 else "")
        data = {"dists": [dataclasses.asdict(d) for d in nvidia]}
        if max_cuda is not None and top > max_cuda[0]:
            out.append(Finding(
                "elf.nvidia", FAIL,
                f"The NVIDIA libraries are CUDA {top} ({names}), but driver {driver_version} supports CUDA <= {gpu_check.fmt_cuda(max_cuda)}.",
                f"Use the CUDA {max_cuda[0]} flavour: `rftstack flavour cuda12` swaps it into this environment (the nvidia-*-cu12 "
                f"libraries of uv.lock's cuda12 group), or the flake's default package (`nix run .#serve`).",
                data,
            ))
        else:
            out.append(Finding("elf.nvidia", OK if max_cuda else INFO, f"The NVIDIA libraries are CUDA {top} ({names}).", "", data))
    if not found:
        out.append(Finding("elf", INFO, "No installed distribution ships CUDA binaries (torch/vllm not installed here?).", ""))
    return out
