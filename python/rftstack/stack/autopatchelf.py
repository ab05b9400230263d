"""What nixpkgs' auto-patchelf would resolve for the flake's wheels, checked on real ELF files.

auto-patchelf resolves each DT_NEEDED of a wheel's ELF files against the package's own shared
objects, ``<input>/lib`` of its buildInputs and the folders ``addAutoPatchelfSearchPath`` adds; a
name it cannot find fails the build unless it is in ``autoPatchelfIgnoreMissingDeps``. The flake
decides all of that per package (``lib.autoPatchelf`` of the flake, from nix/lib/autopatchelf.nix
and nix/data/libraries.toml). :func:`unresolved` applies exactly that plan to a synced environment's
site-packages: each distribution's files (its RECORD) stand for its Nix output. Headers only:
nothing is loaded.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path

from packaging.utils import canonicalize_name

from rftstack.stack.elf import read_links

EM_X86_64 = 62


@dataclasses.dataclass(frozen=True)
class Missing:
    """A DT_NEEDED name nothing in the plan provides: the build of ``dist`` would fail on it."""

    dist: str
    file: str  # relative to site-packages
    library: str


@dataclasses.dataclass(frozen=True)
class Report:
    missing: tuple[Missing, ...]
    files: int  # host ELF files checked
    dists: tuple[str, ...]  # distributions with host ELF files that were checked
    skipped: tuple[str, ...]  # distributions with host ELF files the plan does not cover


def dist_files(site: Path) -> dict[str, list[str]]:
    """Files of each installed distribution (canonical name -> paths relative to ``site``), from RECORD."""
    out: dict[str, list[str]] = {}
    for info in sorted(site.glob("*.dist-info")):
        meta = (info / "METADATA").read_text(errors="replace").split("\n\n", 1)[0]
        name = next((l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Name:")), None)
        record = info / "RECORD"
        if name is None or not record.exists():
            continue
        with record.open(newline="") as f:
            out[canonicalize_name(name)] = [row[0] for row in csv.reader(f) if row and not row[0].startswith("..")]
    return out


def is_host_elf(path: Path) -> bool:
    """An x86-64 ELF file (GPU cubins are ELF too, for another machine: auto-patchelf skips them)."""
    try:
        with path.open("rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_X86_64


def _shared_object_names(files: list[str], under: str = "") -> set[str]:
    prefix = under.rstrip("/") + "/" if under else ""
    names = set()
    for rel in files:
        base = rel.rsplit("/", 1)[-1]
        if rel.startswith(prefix) and (base.endswith(".so") or ".so." in base):
            names.add(base)
    return names


def provided(dist: str, plan: Mapping, files: Mapping[str, list[str]], libraries: Mapping, python_minor: int) -> set[str]:
    """Every library name auto-patchelf can find for ``dist`` under the plan (ignored names included)."""
    p = plan[dist]
    names = _shared_object_names(files.get(dist, []))
    for sp in p["searchPaths"]:
        names |= _shared_object_names(files.get(canonicalize_name(sp["dist"]), []), sp["dir"])
    names |= set(libraries["stdenv"]["names"])
    for attr in p["nixpkgs"]:
        names |= set(libraries["nixpkgs"][attr])
    for attr in p["cuda"]:
        names |= set(libraries["cuda"][attr])
    if p["python"]:
        names.add(f"libpython3.{python_minor}.so.1.0")
    return names | set(p["ignoreMissing"])


def _host_elf_files(site: Path, files: list[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
    for rel in files:
        path = site / rel
        if path.is_symlink() or not is_host_elf(path):
            continue
        links = read_links(path)
        if links is not None:
            yield rel, links.needed


def unresolved(site: Path, plan: Mapping, libraries: Mapping, python_minor: int, *, not_at_hand: tuple[str, ...] = ()) -> Report:
    """Resolve every host ELF file of ``site`` against the plan of the distribution that owns it.

    ``not_at_hand``: distributions the flavour installs from other files than these (the driver-570
    CUDA 12 artifacts): reported as skipped, not checked.
    """
    files = dist_files(site)
    plan = {canonicalize_name(k): v for k, v in plan.items()}
    missing, checked, skipped, count = [], [], [], 0
    for dist in sorted(files):
        elfs = list(_host_elf_files(site, files[dist]))
        if not elfs:
            continue
        if dist not in plan or dist in not_at_hand:
            skipped.append(dist)
            continue
        have = provided(dist, plan, files, libraries, python_minor)
        checked.append(dist)
        count += len(elfs)
        missing += [Missing(dist, rel, lib) for rel, needed in elfs for lib in needed if lib not in have]
    return Report(tuple(missing), count, tuple(checked), tuple(skipped))
