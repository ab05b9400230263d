"""GPU and driver: what the NVIDIA driver is, which CUDA it supports, and what GPUs it sees.

Readers (tried in order by :func:`read`): NVML through nvidia-ml-py (`pynvml`), then
``/proc/driver/nvidia/version`` (driver only), then ``nvidia-smi``. A machine without a GPU yields a
``GpuInfo`` with no driver, which :func:`check` reports as a finding, never a crash.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

from rftstack.findings import FAIL, OK, WARN, Finding

# Driver branch -> the highest CUDA version it supports (NVIDIA's CUDA toolkit release notes,
# table 3 "CUDA Toolkit and Corresponding Driver Versions"). A branch between two rows supports
# what the lower row says.
DRIVER_MAX_CUDA: tuple[tuple[int, tuple[int, int]], ...] = (
    (525, (12, 0)),
    (530, (12, 1)),
    (535, (12, 2)),
    (545, (12, 3)),
    (550, (12, 4)),
    (555, (12, 5)),
    (560, (12, 6)),
    (565, (12, 7)),
    (570, (12, 8)),
    (575, (12, 9)),
    (580, (13, 0)),
)


def driver_branch(driver_version: str) -> int:
    """The branch of a driver version string: "570.133.20" -> 570."""
    m = re.match(r"\s*(\d+)", driver_version)
    if not m:
        raise ValueError(f"not a driver version: {driver_version!r}")
    return int(m.group(1))


def max_cuda_for_driver(driver_version: str) -> tuple[int, int] | None:
    """The highest CUDA (major, minor) a driver supports; None when it predates CUDA 12."""
    branch = driver_branch(driver_version)
    best = None
    for min_branch, cuda in DRIVER_MAX_CUDA:
        if branch >= min_branch:
            best = cuda
    return best


def min_driver_for_cuda(cuda: tuple[int, int]) -> int | None:
    """The lowest driver branch that supports CUDA ``cuda`` (major, minor), if the table knows one."""
    for min_branch, supported in DRIVER_MAX_CUDA:
        if supported >= cuda:
            return min_branch
    return None


def fmt_cuda(cuda: tuple[int, int] | None) -> str:
    return "unknown" if cuda is None else f"{cuda[0]}.{cuda[1]}"


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int] | None
    total_mib: int | None
    free_mib: int | None


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    driver_version: str | None  # None: no NVIDIA driver found
    cuda: tuple[int, int] | None = None  # what the driver itself reports (NVML / nvidia-smi), if it did
    gpus: tuple[Gpu, ...] = ()
    source: str = ""  # "nvml", "/proc/driver/nvidia/version", "nvidia-smi", or a test double's name
    notes: tuple[str, ...] = ()  # why readers that were tried gave nothing

    @property
    def max_cuda(self) -> tuple[int, int] | None:
        """The highest CUDA this driver runs: as reported, else from the driver table."""
        if self.cuda is not None:
            return self.cuda
        if self.driver_version is None:
            return None
        return max_cuda_for_driver(self.driver_version)


# ---------------------------------------------------------------------------------------------
# Readers (the shell around the driver)
# ---------------------------------------------------------------------------------------------

def _cuda_from_int(v: int) -> tuple[int, int]:
    return v // 1000, (v % 1000) // 10


def read_nvml() -> GpuInfo:
    import pynvml  # nvidia-ml-py: a ctypes binding, cheap to import, loads libnvidia-ml lazily

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        cuda = _cuda_from_int(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            gpus.append(Gpu(name, cc, mem.total // 2**20, mem.free // 2**20))
        return GpuInfo(driver, cuda, tuple(gpus), "nvml")
    finally:
        pynvml.nvmlShutdown()


_PROC_RE = re.compile(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_proc_version(text: str) -> str | None:
    """The driver version in the text of /proc/driver/nvidia/version."""
    m = _PROC_RE.search(text)
    return m.group(1) if m else None


def read_proc(path: str | Path = "/proc/driver/nvidia/version") -> GpuInfo:
    version = parse_proc_version(Path(path).read_text())
    if version is None:
        raise ValueError(f"{path} names no driver version")
    return GpuInfo(version, None, (), str(path))


def parse_smi_csv(text: str) -> tuple[str | None, tuple[Gpu, ...]]:
    """Parse `nvidia-smi --query-gpu=driver_version,name,compute_cap,memory.total,memory.free
    --format=csv,noheader,nounits`."""
    driver, gpus = None, []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        driver = parts[0]
        try:
            cc = tuple(int(x) for x in parts[2].split("."))
        except ValueError:
            cc = None
        def num(s):
            return int(float(s)) if re.match(r"^\d+(\.\d+)?$", s) else None
        gpus.append(Gpu(parts[1], cc, num(parts[3]), num(parts[4])))
    return driver, tuple(gpus)


def read_smi(smi: str = "nvidia-smi", timeout: float = 10) -> GpuInfo:
    exe = shutil.which(smi)
    if exe is None:
        raise FileNotFoundError(f"{smi} is not on PATH")
    out = subprocess.run(
        [exe, "--query-gpu=driver_version,name,compute_cap,memory.total,memory.free", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=timeout, check=True,
    ).stdout
    driver, gpus = parse_smi_csv(out)
    if driver is None:
        raise ValueError("nvidia-smi listed no GPU")
    cuda = None
    head = subprocess.run([exe], capture_output=True, text=True, timeout=timeout).stdout
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", head)
    if m:
        cuda = (int(m.group(1)), int(m.group(2)))
    return GpuInfo(driver, cuda, gpus, "nvidia-smi")


def read(proc_version: str | Path = "/proc/driver/nvidia/version") -> GpuInfo:
    """What the driver says, from the first reader that works; a GpuInfo without driver if none does."""
    notes = []
    for name, reader in (("nvml", read_nvml), ("proc", lambda: read_proc(proc_version)), ("nvidia-smi", read_smi)):
        try:
            info = reader()
        except Exception as exc:  # each reader fails in its own way where there is no driver
            notes.append(f"{name}: {exc}".strip())
            continue
        if info.source == str(proc_version) and not info.gpus:
            # /proc names the driver only; nvidia-smi may add the GPUs
            try:
                smi = read_smi()
                return dataclasses.replace(smi, driver_version=smi.driver_version or info.driver_version)
            except Exception as exc:
                notes.append(f"nvidia-smi: {exc}")
        return dataclasses.replace(info, notes=tuple(notes))
    return GpuInfo(None, None, (), "", tuple(notes))


# ---------------------------------------------------------------------------------------------
# The check (pure)
# ---------------------------------------------------------------------------------------------

def check(info: GpuInfo) -> list[Finding]:
    if info.driver_version is None:
        return [Finding(
            "gpu.driver", FAIL,
            "No NVIDIA driver was found (no NVML library, no /proc/driver/nvidia/version, no nvidia-smi), so vLLM cannot start.",
            "Run on a machine with an NVIDIA GPU and driver >= 570 (CUDA 12.8), or make the host's driver visible (e.g. `--gpus all` in a container).",
            {"tried": list(info.notes)},
        )]
    out = []
    cuda = info.max_cuda
    data = {"driver_version": info.driver_version, "max_cuda": fmt_cuda(cuda), "source": info.source}
    if cuda is None:
        out.append(Finding(
            "gpu.driver", FAIL,
            f"NVIDIA driver {info.driver_version} predates CUDA 12, which every build of this stack needs.",
            "Upgrade the driver to 570 or newer (CUDA 12.8).", data,
        ))
    else:
        out.append(Finding("gpu.driver", OK, f"NVIDIA driver {info.driver_version} supports CUDA up to {fmt_cuda(cuda)} (read via {info.source}).", "", data))
    if not info.gpus:
        out.append(Finding(
            "gpu.devices", WARN if info.source.startswith("/proc") else FAIL,
            "The driver is loaded but no GPU could be listed (NVML and nvidia-smi gave nothing).",
            "Check `nvidia-smi`; in a container, pass the GPUs through (`--gpus all`).",
            {"tried": list(info.notes)},
        ))
    for i, g in enumerate(info.gpus):
        cc = "unknown" if g.compute_capability is None else f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        mem = "" if g.total_mib is None else f", {g.total_mib} MiB total, {g.free_mib} MiB free"
        gdata = dataclasses.asdict(g)
        if g.compute_capability is not None and g.compute_capability < (7, 0):
            out.append(Finding(f"gpu.{i}", FAIL, f"GPU {i} ({g.name}, compute capability {cc}) is older than vLLM's minimum 7.0.", "Use a Volta or newer GPU.", gdata))
        else:
            out.append(Finding(f"gpu.{i}", OK, f"GPU {i}: {g.name}, compute capability {cc}{mem}.", "", gdata))
    return out
