"""Python environment: are the installed distributions' requirements met (a `pip check`), read
from dist-info metadata with importlib.metadata + packaging, and judged against the relaxation
policy: a violation the policy covers but that is not yet relaxed says "run `rftstack relax`".

This is where the report's problems 1 and 2 still show (verl's ``numpy<2`` against opencv's
``numpy>=2``): the lock resolves them, the relaxation makes `pip check` clean.

Two kinds of violation do not stop a serve (seen on the GPU host of a bundle install):
- a requirement missing only because the offline bundle left it out on purpose (the installer
  records what it excluded, and why, in ``rftstack_bundle.json`` in site-packages): INFO;
- a violation whose requiring distribution is not part of the locked stack (not in uv.lock's
  resolved set for this environment) and whose modules the serve path (trinity, vllm, verl sources)
  never imports, e.g. a host's sentence-transformers pinning an older huggingface-hub: WARN.
Violations inside the locked stack stay FAIL.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import importlib.util
import json
import re
import sys
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rftstack.findings import FAIL, INFO, OK, WARN, Finding

BUNDLE_RECORD = "rftstack_bundle.json"  # written into site-packages by the bundle installer
SERVE_PACKAGES = ("trinity", "vllm", "verl")  # whose sources the serve path runs


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
        meta = d.metadata  # parsed once: .version and .requires would each parse METADATA again
        name = meta["Name"]
        if not name or canonicalize_name(name) in seen:
            continue
        seen.add(canonicalize_name(name))
        # .requires is METADATA's Requires-Dist, else an egg-info's requires.txt
        requires = meta.get_all("Requires-Dist") or d.requires or ()
        out.append(Dist(name, meta["Version"], tuple(requires)))
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


def bundle_record(paths=None) -> dict | None:
    """The bundle installer's record (bundle id, excluded names, reason) from the first
    site-packages on ``paths`` (default sys.path) that has one."""
    for entry in paths if paths is not None else sys.path:
        f = Path(entry or ".") / BUNDLE_RECORD
        if f.is_file():
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(data.get("excluded"), list):
                return data | {"path": str(f)}
    return None


def locked_names() -> set[str] | None:
    """Canonical names uv.lock resolves for this interpreter (dev group included); None without a lock."""
    from rftstack.stack import lockfile
    from rftstack.errors import UserError

    try:
        lock = lockfile.load()
    except UserError:
        return None
    return set(lock.resolve(lockfile.current_environment(), groups=("dev",)))


def top_level_modules(dist: str, paths=None) -> list[str]:
    """Import names a distribution installs (top_level.txt, else its RECORD's first path parts)."""
    try:
        d = next(iter(md.distributions(name=dist, path=paths))) if paths is not None else md.distribution(dist)
    except (StopIteration, md.PackageNotFoundError):
        return []
    top = d.read_text("top_level.txt")
    if top:
        return sorted({l.strip() for l in top.splitlines() if l.strip()})
    names = set()
    for f in d.files or ():
        first = f.parts[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__") or first.endswith(".pth"):
            continue
        names.add(first[:-3] if first.endswith(".py") else first)
    return sorted(n for n in names if n.isidentifier())


def serve_importers(modules: list[str], packages=SERVE_PACKAGES, limit: int = 3) -> list[str]:
    """Source files of the serve path's packages that import any of ``modules`` (regex over the
    sources, nothing imported; a few hundred ms over trinity + vllm + verl)."""
    if not modules:
        return []
    pat = re.compile(r"^\s*(?:import|from)\s+(?:" + "|".join(map(re.escape, modules)) + r")\b", re.M)
    hits = []
    for pkg in packages:
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            for f in Path(loc).rglob("*.py"):
                try:
                    if pat.search(f.read_text(errors="replace")):
                        hits.append(str(f))
                except OSError:
                    continue
                if len(hits) >= limit:
                    return hits
    return hits


def context(paths=None) -> dict:
    """What check() needs from outside the dist list: the bundle record, the locked names, and how
    to find serve-path importers of a distribution."""
    return {
        "bundle": bundle_record(paths),
        "locked": locked_names(),
        "importers": lambda dist: serve_importers(top_level_modules(dist, paths)),
    }


def _some(violations: list, n: int = 3) -> str:
    """The first ``n`` violations as sentences, and how many more there are."""
    more = f"; and {len(violations) - n} more" if len(violations) > n else ""
    return "; ".join(v.sentence() for v in violations[:n]) + more


def check(dists: list[Dist], policy, *, bundle: dict | None = None, locked: set[str] | None = None, importers=None) -> list[Finding]:
    """Findings for ``dists``. ``bundle``: the bundle installer's record; ``locked``: canonical names
    of the locked stack (None: everything counts as locked); ``importers(dist)``: serve-path files
    importing that distribution's modules."""
    found = violations(dists)
    to_relax = [(v, covered(v, policy)) for v in found]
    relaxable = [v for v, r in to_relax if r is not None]
    other = [v for v, r in to_relax if r is None]
    excluded_names = {canonicalize_name(n) for n in (bundle or {}).get("excluded", [])}
    by_bundle = [v for v in other if v.installed is None and canonicalize_name(Requirement(v.requirement).name) in excluded_names]
    other = [v for v in other if v not in by_bundle]
    outside: list[Violation] = []
    if locked is not None:
        imported: dict[str, list[str]] = {}
        for v in other:
            name = canonicalize_name(v.dist)
            if name in locked:
                continue
            if name not in imported:
                imported[name] = importers(v.dist) if importers else []
            if not imported[name]:
                outside.append(v)
        other = [v for v in other if v not in outside]
    adds = missing_adds(dists, policy)
    out = []
    if by_bundle:
        names = sorted({Requirement(v.requirement).name for v in by_bundle})
        out.append(Finding(
            "pyenv.bundle-excluded", INFO,
            f"{len(by_bundle)} requirement(s) are missing because the offline bundle {str(bundle.get('bundle_id', '?'))[:12]} left them out on purpose "
            f"({', '.join(names)}): {bundle.get('reason', 'excluded when the bundle was built')}.",
            "Nothing to do for serving; a feature that imports one of them needs it installed (rebuild the bundle without that exclusion).",
            {"violations": [dataclasses.asdict(v) for v in by_bundle], "record": bundle.get("path")},
        ))
    if outside:
        shown = _some(outside)
        out.append(Finding(
            "pyenv.outside-lock", WARN,
            f"{len(outside)} requirement(s) of distributions outside the locked stack are not met, and the serve path does not import them: {shown}.",
            "Serving is not affected; to use those packages, install them in another environment (they conflict with the locked stack).",
            {"violations": [dataclasses.asdict(v) for v in outside]},
        ))
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
        shown = _some(other)
        out.append(Finding(
            "pyenv.requirements", FAIL,
            f"{len(other)} installed requirement(s) are not met: {shown}.",
            "Reinstall the locked stack (`uv sync --frozen`, or the flake's `nix run .#serve`) instead of upgrading packages by hand.",
            {"violations": [dataclasses.asdict(v) for v in other]},
        ))
    if not any(f.status in (WARN, FAIL) for f in out):
        what = "All requirements" if not out else "All other requirements"
        out.append(Finding("pyenv.requirements", OK, f"{what} of the {len(dists)} installed distributions are met"
                           + (" (`pip check` is clean)." if not out else "."), "", {"dists": len(dists)}))
    return out
