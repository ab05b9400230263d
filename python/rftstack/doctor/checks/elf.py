"""Binaries against the driver: which CUDA major each installed CUDA extension was linked for.

The dynamic section (DT_NEEDED, DT_SONAME) of every shared object of torch, vllm, flashinfer,
triton and the nvidia-* libraries is read with pyelftools (headers only, nothing is loaded), and
the CUDA major is taken from the sonames of the CUDA runtime libraries they need
(``libcudart.so.13`` -> CUDA 13). A CUDA 13 binary under a driver that stops at 12.8 is the report's
problem 3 (``ImportError: libcudart.so.13``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import re
from pathlib import Path

from rftstack.doctor.checks import gpu as gpu_check
from rftstack.findings import FAIL, INFO, OK, Finding

# Libraries whose soname major is the CUDA major (cuFFT, cuSPARSE, cuRAND... are versioned on their
# own and are left out on purpose).
CUDA_VERSIONED = ("libcudart", "libnvrtc", "libcublas", "libcublasLt", "libnvJitLink", "libcupti")
_SONAME = re.compile(r"^(lib[A-Za-z_]+)\.so\.(\d+)")

# Distributions whose binaries run on the GPU. nvidia-* and cuda-* are matched by prefix.
WATCHED = ("torch", "vllm", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "triton", "xformers", "vllm-flash-attn")
WATCHED_PREFIXES = ("nvidia-",)


def cuda_major_of(sonames) -> int | None:
    """The CUDA major a set of sonames (needed or provided) implies, or None if it names no CUDA runtime."""
    majors = set()
    for name in sonames:
        m = _SONAME.match(name)
        if m and m.group(1) in CUDA_VERSIONED:
            majors.add(int(m.group(2)))
    return max(majors) if majors else None


@dataclasses.dataclass(frozen=True)
class ElfLinks:
    path: str
    soname: str | None
    needed: tuple[str, ...]

    @property
    def cuda_major(self) -> int | None:
        return cuda_major_of(self.needed + ((self.soname,) if self.soname else ()))


def read_links(path: str | Path) -> ElfLinks | None:
    """DT_SONAME and DT_NEEDED of a shared object; None if it is not an ELF file with a dynamic section."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            elf = ELFFile(f)
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    needed, soname = [], None
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)
                        elif tag.entry.d_tag == "DT_SONAME":
                            soname = tag.soname
                    return ElfLinks(str(path), soname, tuple(needed))
    except (ELFError, OSError, ValueError):
        return None
    return None


def _is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]


@dataclasses.dataclass(frozen=True)
class DistCuda:
    dist: str
    version: str
    cuda_major: int  # the highest CUDA major any of its binaries needs or provides
    example: str  # a file that needs it
    lib: str  # the soname that says so


def scan_dist(dist: md.Distribution) -> DistCuda | None:
    best: tuple[int, str, str] | None = None
    for f in dist.files or ():
        s = str(f)
        if not _is_shared_object(s):
            continue
        links = read_links(dist.locate_file(f))
        if links is None or links.cuda_major is None:
            continue
        lib = next(n for n in links.needed + ((links.soname,) if links.soname else ()) if cuda_major_of([n]) == links.cuda_major)
        if best is None or links.cuda_major > best[0]:
            best = (links.cuda_major, s, lib)
    if best is None:
        return None
    return DistCuda(dist.metadata["Name"], dist.version, *best)


def watched(name: str) -> bool:
    n = name.lower().replace("_", "-")
    return n in WATCHED or n.startswith(WATCHED_PREFIXES)


def scan(distributions=None) -> list[DistCuda]:
    """CUDA majors of the installed GPU distributions (this interpreter's, unless given)."""
    out, seen = [], set()
    for dist in distributions if distributions is not None else md.distributions():
        name = dist.metadata["Name"] or ""
        if not watched(name) or name.lower() in seen:
            continue
        seen.add(name.lower())
        found = scan_dist(dist)
        if found:
            out.append(found)
    return sorted(out, key=lambda d: d.dist.lower())


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
