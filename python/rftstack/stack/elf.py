"""ELF files of the installed stack: DT_NEEDED and DT_SONAME of shared objects (read with pyelftools,
headers only, nothing is loaded) and the CUDA major their sonames imply (``libcudart.so.13`` -> 13).

Used by the doctor's ELF check, the flake's library-resolution test and `rftstack flavour`.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata as md
import re
from pathlib import Path

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


def shared_objects(dist: md.Distribution) -> list[str]:
    """The shared objects a distribution installed (paths relative to its site directory). RECORD's
    lines are filtered before they become paths: torch's alone has about 20000 lines."""
    text = dist.read_text("RECORD")
    if text is None:  # no dist-info RECORD (egg-info): what importlib lists
        return [str(f) for f in dist.files or () if _is_shared_object(str(f))]
    rows = csv.reader(line for line in text.splitlines() if ".so" in line)
    return [row[0] for row in rows if row and _is_shared_object(row[0])]


def scan_dist(dist: md.Distribution) -> DistCuda | None:
    best: tuple[int, str, str] | None = None
    for s in shared_objects(dist):
        links = read_links(dist.locate_file(s))
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
