"""The relaxation policy (data/policy.toml), loaded into plain records.

Standard library only: the Nix build runs `relax.py` and `patches.py` from this package in a bare
Python, so `canonical` is a PEP 503 regex here rather than `packaging.utils.canonicalize_name`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path

DEFAULT_PATH = Path(__file__).parent.parent / "data" / "policy.toml"

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical distribution name a PEP 508 requirement line is about."""
    m = _NAME.match(requirement)
    if not m:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(m.group(1))


@dataclasses.dataclass(frozen=True)
class Relax:
    dist: str
    version: str
    was: str
    now: str
    why: str


@dataclasses.dataclass(frozen=True)
class Add:
    dist: str
    version: str
    requirement: str
    why: str


@dataclasses.dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    replaces: str
    url: str
    sha256: str
    note: str = ""
    size: int | None = None  # bytes, where a public record gives it (the fetcher then checks it too)

    @property
    def filename(self) -> str:
        from urllib.parse import unquote

        return unquote(self.url.rsplit("/", 1)[-1])


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A Requires-Dist line of a CUDA 12 artifact that the pip/uv route rewrites after installing it:
    the line naming ``requirement`` (extras-only lines untouched) becomes ``now`` (none: removed)."""

    dist: str
    version: str
    requirement: str
    now: tuple[str, ...]
    why: str


@dataclasses.dataclass(frozen=True)
class Patch:
    dist: str
    version: str
    file: str  # name under patches/ (repo root; rftstack/data/patches in the wheel)
    sha256: str
    why: str


@dataclasses.dataclass(frozen=True)
class Policy:
    relax: tuple[Relax, ...]
    add: tuple[Add, ...]
    cuda12: dict
    artifacts: tuple[Artifact, ...]
    path: Path
    patches: tuple[Patch, ...] = ()
    rewrites: tuple[Rewrite, ...] = ()

    def drop_names(self) -> set[str]:
        """Canonical names of the lock's CUDA 13-only distributions ([[cuda12.drop]])."""
        return {canonical(d["dist"]) for d in self.cuda12.get("drop", [])}

    def dists(self) -> set[str]:
        """Every distribution whose metadata the policy changes."""
        return {canonical(r.dist) for r in self.relax} | {canonical(a.dist) for a in self.add}

    def for_dist(self, dist: str) -> tuple[list[Relax], list[Add]]:
        c = canonical(dist)
        return ([r for r in self.relax if canonical(r.dist) == c], [a for a in self.add if canonical(a.dist) == c])


class PolicyError(ValueError):
    pass


def load(path: str | os.PathLike | None = None) -> Policy:
    path = Path(path or os.environ.get("RFTSTACK_POLICY") or DEFAULT_PATH)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PolicyError(f"policy file {path} does not exist; reinstall rftstack or pass the right --policy") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path} is not valid TOML ({exc}); fix the file") from None
    if data.get("schema") != 1:
        raise PolicyError(f"policy file {path} has schema {data.get('schema')!r}, this rftstack reads schema 1")
    try:
        relax = tuple(Relax(**r) for r in data.get("relax", []))
        add = tuple(Add(**a) for a in data.get("add", []))
        cuda12 = data.get("cuda12", {})
        artifacts = tuple(Artifact(**a) for a in cuda12.get("artifact", []))
        patches = tuple(Patch(**p) for p in data.get("patch", []))
        rewrites = tuple(Rewrite(**(r | {"now": tuple(r.get("now", ()))})) for r in cuda12.get("rewrite", []))
    except TypeError as exc:
        raise PolicyError(f"policy file {path} has an entry with wrong keys ({exc})") from None
    for r in relax:
        if requirement_name(r.was) != requirement_name(r.now):
            raise PolicyError(f"policy file {path}: relax of {r.dist} turns {r.was!r} into another package {r.now!r}")
    return Policy(relax, add, cuda12, artifacts, path, patches, rewrites)
