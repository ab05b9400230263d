"""Python environment: are the installed distributions' requirements met (a `pip check`), read
from dist-info metadata with importlib.metadata + packaging, and judged against the relaxation
policy: a violation the policy covers but that is not yet relaxed says "run `rftstack relax`".

This is where the report's problems 1 and 2 still show (verl's ``numpy<2`` against opencv's
``numpy>=2``): the lock resolves them, the relaxation makes `pip check` clean.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rftstack.findings import FAIL, OK, WARN, Finding


@dataclasses.dataclass(frozen=True)
class Dist:
    name: str
    version: str
    requires: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Violation:
    dist: str
    version: str
    requirement: str  # the Requires-Dist line
    installed: str | None  # the installed version of what it needs, None if missing

    def sentence(self) -> str:
        req = Requirement(self.requirement)
        if self.installed is None:
            return f"{self.dist} {self.version} requires {req.name}, which is not installed"
        return f"{self.dist} {self.version} has requirement {req}, but you have {req.name} {self.installed}"


def installed(paths=None) -> list[Dist]:
    """The distributions importlib.metadata sees (first one of each name wins, as imports do)."""
    out, seen = [], set()
    dists = md.distributions(path=paths) if paths is not None else md.distributions()
    for d in dists:
        name = d.metadata["Name"]
        if not name or canonicalize_name(name) in seen:
            continue
        seen.add(canonicalize_name(name))
        out.append(Dist(name, d.version, tuple(d.requires or ())))
    return out


def violations(dists: list[Dist]) -> list[Violation]:
    """Unmet requirements, as `pip check` judges them: base requirements (no extras) whose
    markers hold in this interpreter."""
    versions = {canonicalize_name(d.name): d.version for d in dists}
    out = []
    for d in dists:
        for line in d.requires:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except UndefinedEnvironmentName:
                continue
            have = versions.get(canonicalize_name(req.name))
            if have is None:
                out.append(Violation(d.name, d.version, line, None))
                continue
            try:
                ok = req.specifier.contains(Version(have), prereleases=True)
            except InvalidVersion:
                ok = True
            if not ok:
                out.append(Violation(d.name, d.version, line, have))
    return out


def _same_req(a: str, b: str) -> bool:
    try:
        ra, rb = Requirement(a), Requirement(b)
    except InvalidRequirement:
        return a.strip() == b.strip()
    return canonicalize_name(ra.name) == canonicalize_name(rb.name) and ra.specifier == rb.specifier and str(ra.marker) == str(rb.marker)


def covered(v: Violation, policy) -> object | None:
    """The policy [[relax]] entry that rewrites exactly this requirement, if any."""
    for r in policy.relax:
        if canonicalize_name(r.dist) == canonicalize_name(v.dist) and r.version == v.version and _same_req(r.was, v.requirement):
            return r
    return None


def missing_adds(dists: list[Dist], policy) -> list:
    """Policy [[add]] requirements not yet declared by the distribution they belong to."""
    by_name = {canonicalize_name(d.name): d for d in dists}
    out = []
    for a in policy.add:
        d = by_name.get(canonicalize_name(a.dist))
        if d is None or d.version != a.version:
            continue
        if not any(_same_req(a.requirement, line) for line in d.requires):
            out.append(a)
    return out


def check(dists: list[Dist], policy) -> list[Finding]:
    found = violations(dists)
    to_relax = [(v, covered(v, policy)) for v in found]
    relaxable = [v for v, r in to_relax if r is not None]
    other = [v for v, r in to_relax if r is None]
    adds = missing_adds(dists, policy)
    out = []
    if relaxable:
        out.append(Finding(
            "pyenv.relax", WARN,
            "; ".join(v.sentence() for v in relaxable) + " (the policy's known relaxation, not yet applied, so `pip check` is dirty).",
            "Run `rftstack relax`.",
            {"violations": [dataclasses.asdict(v) for v in relaxable]},
        ))
    if adds:
        out.append(Finding(
            "pyenv.relax.add", WARN,
            "; ".join(f"{a.dist} {a.version} does not declare {a.requirement}" for a in adds) + " (policy [[add]], not yet applied).",
            "Run `rftstack relax`.",
            {"adds": [a.requirement for a in adds]},
        ))
    if other:
        shown = "; ".join(v.sentence() for v in other[:3]) + (f"; and {len(other) - 3} more" if len(other) > 3 else "")
        out.append(Finding(
            "pyenv.requirements", FAIL,
            f"{len(other)} installed requirement(s) are not met: {shown}.",
            "Reinstall the locked stack (`uv sync --frozen`, or the flake's `nix run .#serve`) instead of upgrading packages by hand.",
            {"violations": [dataclasses.asdict(v) for v in other]},
        ))
    if not out:
        out.append(Finding("pyenv.requirements", OK, f"All requirements of the {len(dists)} installed distributions are met (`pip check` is clean).", "", {"dists": len(dists)}))
    return out
