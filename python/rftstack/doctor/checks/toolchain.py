"""JIT toolchains that run at serve time, against the driver.

- Triton compiles its kernels with ``ptxas``: ``TRITON_PTXAS_PATH`` if set (and runnable), else the
  one bundled under ``triton/backends/nvidia/bin`` (``ptxas-blackwell`` / ``TRITON_PTXAS_BLACKWELL_PATH``
  for compute capability >= 10), exactly as ``triton.knobs.env_nvidia_tool`` picks it.
- FlashInfer's JIT (vLLM's FlashInfer sampler) runs ``$CUDA_HOME/bin/nvcc``: ``CUDA_HOME``, else
  ``CUDA_PATH``, else the directory above ``nvcc`` on PATH, else ``/usr/local/cuda``, as
  ``flashinfer.jit.cpp_ext.get_cuda_path`` does.
Code built by a toolkit newer than the driver fails at run time ("PTX was compiled with an
unsupported toolchain"), so a toolchain newer than the driver's CUDA is a failure.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from rftstack.doctor.checks.gpu import fmt_cuda
from rftstack.findings import FAIL, INFO, OK, WARN, Finding

_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def parse_release(text: str) -> tuple[int, int] | None:
    """The CUDA release in `ptxas --version` / `nvcc --version` output."""
    m = _RELEASE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def tool_version(path: str, timeout: float = 10) -> tuple[int, int] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_release(out.stdout + out.stderr) if out.returncode == 0 else None


@dataclasses.dataclass(frozen=True)
class Tool:
    role: str  # "ptxas" (Triton) or "nvcc" (FlashInfer)
    path: str | None  # None: none found
    chosen_by: str  # how it was picked: the env var, "triton's bundled ptxas", "nvcc on PATH", ...
    version: tuple[int, int] | None


def triton_dir() -> Path | None:
    spec = importlib.util.find_spec("triton")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_ptxas(env, blackwell: bool = False, version=tool_version) -> Tool:
    binary = "ptxas-blackwell" if blackwell else "ptxas"
    var = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
    tdir = triton_dir()
    bundled = str(tdir / "backends" / "nvidia" / "bin" / binary) if tdir else None
    candidates = []
    if env.get(var):
        candidates.append((env[var], f"${var}"))
    if bundled:
        candidates.append((bundled, f"triton's bundled {binary}"))
    for path, how in candidates:
        v = version(path)
        if v is not None:
            note = "" if how.startswith("$") or not env.get(var) else f" (${var}={env[var]} does not run, Triton falls back)"
            return Tool("ptxas", path, how + note, v)
    return Tool("ptxas", None, f"${var} unset and no triton installed" if not candidates else "none of " + ", ".join(p for p, _ in candidates) + " runs", None)


def find_nvcc(env, version=tool_version) -> Tool:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            home, how = env[var], f"${var}"
            break
    else:
        on_path = shutil.which("nvcc", path=env.get("PATH", os.defpath))
        if on_path:
            home, how = str(Path(on_path).parent.parent), "nvcc on PATH"
        else:
            home, how = "/usr/local/cuda", "the default /usr/local/cuda"
    nvcc = str(Path(home) / "bin" / "nvcc")
    if not os.access(nvcc, os.X_OK):
        return Tool("nvcc", None, f"{how}: {nvcc} does not exist", None)
    return Tool("nvcc", nvcc, how, version(nvcc))


def check(ptxas: Tool, nvcc: Tool, max_cuda: tuple[int, int] | None, env) -> list[Finding]:
    out = []
    drv = "no driver found" if max_cuda is None else f"the driver supports CUDA <= {fmt_cuda(max_cuda)}"
    # Triton's ptxas
    data = dataclasses.asdict(ptxas)
    if ptxas.path is None:
        out.append(Finding("toolchain.ptxas", WARN, f"Triton has no runnable ptxas ({ptxas.chosen_by}), so its kernels cannot compile.",
                           "Set TRITON_PTXAS_PATH to the ptxas of a CUDA toolkit no newer than the driver (e.g. CUDA 12.8's).", data))
    elif max_cuda is None:
        out.append(Finding("toolchain.ptxas", INFO, f"Triton will use ptxas {fmt_cuda(ptxas.version)} ({ptxas.chosen_by}: {ptxas.path}); {drv}.", "", data))
    elif ptxas.version > max_cuda:
        out.append(Finding("toolchain.ptxas", FAIL,
                           f"Triton will use ptxas {fmt_cuda(ptxas.version)} ({ptxas.chosen_by}: {ptxas.path}) but {drv}, so its kernels fail with \"PTX was compiled with an unsupported toolchain\".",
                           f"Set TRITON_PTXAS_PATH to the ptxas of CUDA <= {fmt_cuda(max_cuda)} (the flake's serve sets it to CUDA 12.8's).", data))
    else:
        out.append(Finding("toolchain.ptxas", OK, f"Triton will use ptxas {fmt_cuda(ptxas.version)} ({ptxas.chosen_by}), no newer than the driver's CUDA {fmt_cuda(max_cuda)}.", "", data))
    # FlashInfer's nvcc
    data = dataclasses.asdict(nvcc)
    sampler_off = env.get("VLLM_USE_FLASHINFER_SAMPLER") == "0"
    data["VLLM_USE_FLASHINFER_SAMPLER"] = env.get("VLLM_USE_FLASHINFER_SAMPLER")
    if nvcc.path is None:
        if sampler_off:
            out.append(Finding("toolchain.nvcc", OK, f"No nvcc for FlashInfer's JIT ({nvcc.chosen_by}), and VLLM_USE_FLASHINFER_SAMPLER=0 keeps vLLM off it.", "", data))
        else:
            out.append(Finding("toolchain.nvcc", WARN, f"FlashInfer's JIT finds no nvcc ({nvcc.chosen_by}), so vLLM's FlashInfer sampler fails to build at the first request.",
                               f"Set CUDA_HOME to a CUDA toolkit <= {fmt_cuda(max_cuda) if max_cuda else 'the driver'} or set VLLM_USE_FLASHINFER_SAMPLER=0.", data))
    elif nvcc.version is None:
        out.append(Finding("toolchain.nvcc", WARN, f"FlashInfer would run {nvcc.path} ({nvcc.chosen_by}) but `nvcc --version` names no release.",
                           "Point CUDA_HOME at a working CUDA toolkit or set VLLM_USE_FLASHINFER_SAMPLER=0.", data))
    elif max_cuda is None:
        out.append(Finding("toolchain.nvcc", INFO, f"FlashInfer's JIT will use nvcc {fmt_cuda(nvcc.version)} ({nvcc.chosen_by}: {nvcc.path}); {drv}.", "", data))
    elif nvcc.version > max_cuda:
        if sampler_off:
            out.append(Finding("toolchain.nvcc", WARN, f"nvcc {fmt_cuda(nvcc.version)} ({nvcc.chosen_by}) is newer than the driver's CUDA {fmt_cuda(max_cuda)}; VLLM_USE_FLASHINFER_SAMPLER=0 keeps the sampler off it, but any other FlashInfer JIT would fail.",
                               f"Set CUDA_HOME to a CUDA toolkit <= {fmt_cuda(max_cuda)} (the flake pins 12.8).", data))
        else:
            out.append(Finding("toolchain.nvcc", FAIL,
                               f"FlashInfer's JIT will use nvcc {fmt_cuda(nvcc.version)} ({nvcc.chosen_by}: {nvcc.path}) but {drv}, so the kernels it builds will not load.",
                               f"Set CUDA_HOME to a CUDA toolkit <= {fmt_cuda(max_cuda)} (the flake pins 12.8), or set VLLM_USE_FLASHINFER_SAMPLER=0.", data))
    else:
        out.append(Finding("toolchain.nvcc", OK, f"FlashInfer's JIT will use nvcc {fmt_cuda(nvcc.version)} ({nvcc.chosen_by}), no newer than the driver's CUDA {fmt_cuda(max_cuda)}.", "", data))
    return out
