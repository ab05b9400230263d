"""What an offline bundle holds, decided from uv.lock alone: pure functions, no I/O but reading data.

For a target (CPython version, manylinux platform) the plan takes the locked packages the root
project installs there (`lockfile.Lock.resolve`), picks for each the lock's wheel whose tags fit
the target best (`packaging.tags` order), falls back to the lock's sdist when no wheel is listed
at all (built into a pure-Python wheel later), and leaves out what the target already has at the
same version (`--have`, a `pip freeze`) and what the user excluded.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import tomllib
from pathlib import Path

from rftstack.errors import UserError
from rftstack.stack.lockfile import Artifact, Lock, LockedPackage, target_environment
from rftstack.stack.policy import canonical

PRESETS_PATH = Path(__file__).parent.parent / "data" / "bundle_presets.toml"

# How a package gets into the bundle (or why not).
WHEEL, SDIST, PROJECT = "wheel", "sdist", "project"  # kind
SEND, PRESENT, EXCLUDED = "send", "present", "excluded"  # status


@dataclasses.dataclass(frozen=True)
class Target:
    python: str  # "3.12" or "3.12.3"
    platform: str  # "manylinux_2_28_x86_64"

    @property
    def python_tag(self) -> str:
        major, minor = self.python.split(".")[:2]
        return f"cp{major}{minor}"

    @property
    def machine(self) -> str:
        return platform_machine(self.platform)

    def marker_env(self) -> dict[str, str]:
        return target_environment(self.python, self.machine)

    def as_dict(self) -> dict:
        return {"python": self.python, "platform": self.platform, "python_tag": self.python_tag}

    def __str__(self) -> str:
        return f"CPython {self.python} on {self.platform}"


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_PY = re.compile(r"^3\.\d+(\.\d+)?$")


def parse_target(python: str, platform: str) -> Target:
    if not _PY.match(python):
        raise UserError(f"--python {python!r} is not a CPython 3 version; pass e.g. 3.12 or 3.12.3")
    platform_machine(platform)  # validates
    return Target(python, platform)


def platform_machine(platform: str) -> str:
    m = _MANYLINUX.match(platform)
    if m:
        return m.group(3)
    for legacy in _LEGACY:
        if platform.startswith(legacy + "_"):
            return platform[len(legacy) + 1 :]
    if platform.startswith("linux_"):
        return platform[len("linux_") :]
    raise UserError(f"--platform {platform!r} is not a Linux wheel platform; pass e.g. manylinux_2_28_x86_64")


def platform_tags(platform: str) -> list[str]:
    """Every platform tag a pip on that platform accepts, best first (manylinux_2_28 also takes
    manylinux_2_27 ... manylinux_2_5 and the legacy manylinux2014/2010/1 aliases)."""
    m = _MANYLINUX.match(platform)
    legacy = next((k for k in _LEGACY if platform.startswith(k + "_")), None)
    if legacy:
        major, minor = _LEGACY[legacy]
        arch = platform[len(legacy) + 1 :]
    elif m:
        major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
    else:
        return [platform]
    alias = {v: k for k, v in _LEGACY.items()}
    tags = []
    for glibc_minor in range(minor, 4, -1):
        tags.append(f"manylinux_{major}_{glibc_minor}_{arch}")
        if (major, glibc_minor) in alias:
            tags.append(f"{alias[(major, glibc_minor)]}_{arch}")
    return tags


def supported_tags(target: Target) -> list:
    """packaging Tags the target's pip accepts, in its order of preference."""
    from packaging import tags

    version = tuple(int(x) for x in target.python.split(".")[:2])
    plats = platform_tags(target.platform)
    return list(tags.cpython_tags(version, platforms=plats)) + list(tags.compatible_tags(version, f"cp{version[0]}{version[1]}", plats))


def pick_wheel(wheels: tuple[Artifact, ...], supported: list) -> Artifact | None:
    """The wheel whose best tag comes first in ``supported``; None if none fits."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    rank = {t: i for i, t in enumerate(supported)}
    best: tuple[int, Artifact] | None = None
    for w in wheels:
        try:
            _, _, _, wtags = parse_wheel_filename(w.filename)
        except InvalidWheelFilename:
            continue
        r = min((rank[t] for t in wtags if t in rank), default=None)
        if r is not None and (best is None or r < best[0]):
            best = (r, w)
    return best[1] if best else None


def parse_freeze(text: str) -> dict[str, str]:
    """`pip freeze` output -> canonical name -> version (comments, -e and URL lines skipped)."""
    have: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*([^\s;]+)", line)
        if m:
            have[canonical(m.group(1))] = m.group(2)
    return have


def same_version(have: str, locked: str) -> bool:
    """True when the target's version is the locked one; a local label on the target's side
    (torch 2.11.0+cu130 for PyPI's torch 2.11.0, which is that build) is ignored."""
    from packaging.version import InvalidVersion, Version

    try:
        h, l = Version(have), Version(locked)
    except InvalidVersion:
        return have == locked
    return h == l or (l.local is None and Version(h.public) == l)


def load_presets(path: Path = PRESETS_PATH) -> dict[str, dict]:
    data = tomllib.loads(path.read_text())
    return {p["name"]: p for p in data.get("preset", [])}


def excluded_by(name: str, patterns: list[str]) -> str | None:
    """The first pattern (PEP 503 names, `*` globs) that matches ``name``."""
    c = canonical(name)
    for p in patterns:
        if fnmatch.fnmatchcase(c, canonical(p).replace("-*", "*") if p.endswith("*") else canonical(p)):
            return p
    return None


@dataclasses.dataclass(frozen=True)
class Item:
    name: str  # canonical distribution name
    version: str
    kind: str  # WHEEL, SDIST (build a wheel here) or PROJECT (the root project, built here)
    status: str  # SEND, PRESENT or EXCLUDED
    artifact: Artifact | None  # the wheel (WHEEL) or sdist (SDIST) to download; None for PROJECT
    reason: str = ""  # why PRESENT / EXCLUDED

    @property
    def size(self) -> int:
        return (self.artifact.size or 0) if self.artifact else 0

    def as_dict(self) -> dict:
        d = {"name": self.name, "version": self.version, "kind": self.kind, "status": self.status, "size": self.size}
        if self.artifact:
            d["file"] = self.artifact.filename
            d["url"] = self.artifact.url
        if self.reason:
            d["reason"] = self.reason
        return d


CUDA12 = "cuda12"


def flavour_swaps(pol, supported: list, target: Target) -> dict[str, tuple[str, Artifact]]:
    """Canonical name -> (version, artifact) of the policy's CUDA 12 builds, each checked to fit the target."""
    out = {}
    for a in pol.artifacts:
        art = Artifact(a.url, a.sha256, a.size, a.filename)
        if pick_wheel((art,), supported) is None:
            raise UserError(f"the policy's CUDA 12 build {a.filename} does not fit {target}; pass --python 3.12 (the builds are cp312)")
        out[canonical(a.name)] = (a.version, art)
    return out


def plan(lock: Lock, target: Target, *, have: dict[str, str] | None = None, exclude: list[str] = (), flavour: str | None = None, pol=None) -> list[Item]:
    """One Item per locked package the target installs, sorted by name.

    ``flavour="cuda12"`` (with the policy ``pol``): the lock's cuda12 group is added, every CUDA
    13-only distribution ([[cuda12.drop]], ``*-cu13``) left out, and the policy's CUDA 12 builds
    replace the lock's torch/torchvision/torchaudio/vllm."""
    supported = supported_tags(target)
    swaps: dict[str, tuple[str, Artifact]] = {}
    if flavour == CUDA12:
        drop = pol.drop_names()
        gone = {p.name for p in lock.packages if p.name in drop or p.name.endswith("-cu13")}
        chosen = lock.resolve(target.marker_env(), groups=(CUDA12,), exclude=gone)
        swaps = flavour_swaps(pol, supported, target)
    elif flavour is None:
        chosen = lock.resolve(target.marker_env())
    else:
        raise UserError(f"--flavour {flavour!r} is not known; pass cuda12 (or leave it out for the lock's CUDA 13 builds)")
    have = have or {}
    items: list[Item] = []
    no_wheel: list[str] = []
    for name in sorted(chosen):
        pkg: LockedPackage = chosen[name]
        pattern = excluded_by(name, list(exclude))
        if pkg.is_root:
            kind, art = PROJECT, None
        elif name in swaps:
            kind, (version, art) = WHEEL, swaps[name]
            pkg = dataclasses.replace(pkg, version=version)
        else:
            art = pick_wheel(pkg.wheels, supported)
            kind = WHEEL
            if art is None:
                if pkg.wheels or pkg.sdist is None:
                    if pattern is None and not (name in have and same_version(have[name], pkg.version)):
                        no_wheel.append(f"{name} {pkg.version}")
                    kind = WHEEL
                else:
                    kind, art = SDIST, pkg.sdist
        if pattern is not None:
            items.append(Item(name, pkg.version, kind, EXCLUDED, art, f"excluded ({pattern})"))
        elif name in have and same_version(have[name], pkg.version) and not pkg.is_root:
            items.append(Item(name, pkg.version, kind, PRESENT, art, f"target has {have[name]}"))
        else:
            items.append(Item(name, pkg.version, kind, SEND, art))
    if no_wheel:
        raise UserError(
            f"uv.lock has no wheel for {target} of {', '.join(no_wheel)}; pass another --platform/--python, "
            f"or --exclude {'/'.join(n.split()[0] for n in no_wheel)} if the target does not need it"
        )
    return items
