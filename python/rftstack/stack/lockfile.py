"""uv.lock, read: which locked packages a given target environment installs.

Walks the dependency graph from the root project, evaluating each edge's marker for the target
(Python version, platform) and following extras, the way `uv sync` chooses what to install.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import tomllib
from pathlib import Path

from rftstack.errors import UserError
from rftstack.stack.policy import canonical

ROOT_DIR = Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class Artifact:
    url: str
    sha256: str
    size: int | None
    filename: str


@dataclasses.dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    source: dict
    wheels: tuple[Artifact, ...]
    sdist: Artifact | None

    @property
    def is_root(self) -> bool:
        return "editable" in self.source or "virtual" in self.source


def target_environment(python: str | None = None, machine: str = "x86_64") -> dict[str, str]:
    """PEP 508 marker environment for CPython ``python`` (e.g. "3.12" or "3.12.3") on Linux."""
    if python is None:
        python = platform.python_version()
    parts = python.split(".")
    full = python if len(parts) >= 3 else f"{python}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(parts[:2]),
        "sys_platform": "linux",
    }


def _artifact(entry: dict) -> Artifact:
    url = entry.get("url") or entry.get("path") or entry.get("filename", "")
    algo, _, digest = entry.get("hash", ":").partition(":")
    return Artifact(url, digest if algo == "sha256" else "", entry.get("size"), url.rsplit("/", 1)[-1])


class Lock:
    def __init__(self, data: dict, path: Path):
        self.data = data
        self.path = path
        self.packages: list[LockedPackage] = []
        self._raw: dict[tuple[str, str], dict] = {}
        self._by_name: dict[str, list[LockedPackage]] = {}  # _find is called for every edge of a resolve
        for p in data.get("package", []):
            lp = LockedPackage(
                canonical(p["name"]),
                p.get("version", ""),
                p.get("source", {}),
                tuple(_artifact(w) for w in p.get("wheels", [])),
                _artifact(p["sdist"]) if "sdist" in p else None,
            )
            self.packages.append(lp)
            self._raw[(lp.name, lp.version)] = p
            self._by_name.setdefault(lp.name, []).append(lp)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def root(self) -> LockedPackage:
        roots = [p for p in self.packages if p.is_root]
        if len(roots) != 1:
            raise UserError(f"{self.path} has {len(roots)} root projects, expected one; regenerate it with `uv lock`")
        return roots[0]

    def _find(self, name: str, version: str | None) -> LockedPackage:
        cands = [p for p in self._by_name.get(canonical(name), []) if version is None or p.version == version]
        if len(cands) != 1:
            raise UserError(f"{self.path} names {name} {version or ''} {len(cands)} times; regenerate it with `uv lock`")
        return cands[0]

    def resolve(
        self, env: dict[str, str], groups: tuple[str, ...] = (), exclude: frozenset[str] | set[str] = frozenset()
    ) -> dict[str, LockedPackage]:
        """Canonical name -> locked package, for everything the target installs (root included).

        ``exclude``: canonical names whose incoming edges are removed (a flavour that drops them)."""
        return self._walk(env, [(self.root(), "")], groups, exclude)

    def group(self, env: dict[str, str], name: str) -> dict[str, LockedPackage]:
        """Canonical name -> locked package, for one dependency group of the root project and what
        it pulls (the root's own dependencies left out); empty when the lock has no such group."""
        root = self.root()
        edges = self._raw[(root.name, root.version)].get("dev-dependencies", {}).get(name, [])
        return self._walk(env, self._targets(env, edges, frozenset()), (), frozenset())

    def _targets(self, env: dict[str, str], edges: list[dict], exclude) -> list[tuple[LockedPackage, str]]:
        from packaging.markers import Marker

        out: list[tuple[LockedPackage, str]] = []
        for dep in edges:
            if canonical(dep["name"]) in exclude:
                continue
            if "marker" in dep and not Marker(dep["marker"]).evaluate(env):
                continue
            target = self._find(dep["name"], dep.get("version"))
            out.append((target, ""))
            out += [(target, e) for e in dep.get("extra", [])]
        return out

    def _walk(self, env: dict[str, str], stack: list[tuple[LockedPackage, str]], groups: tuple[str, ...], exclude) -> dict[str, LockedPackage]:
        root = self.root()
        chosen: dict[str, LockedPackage] = {}
        seen: set[tuple[str, str, str]] = set()
        while stack:
            pkg, extra = stack.pop()
            key = (pkg.name, pkg.version, extra)
            if key in seen:
                continue
            seen.add(key)
            chosen[pkg.name] = pkg
            raw = self._raw[(pkg.name, pkg.version)]
            if extra:
                edges = raw.get("optional-dependencies", {}).get(extra, [])
            else:
                edges = list(raw.get("dependencies", []))
                if pkg is root:
                    for g in groups:
                        edges += raw.get("dev-dependencies", {}).get(g, [])
            stack += self._targets(env, edges, exclude)
        return chosen


def find_lock(explicit: str | os.PathLike | None = None) -> Path:
    """The uv.lock to use: ``explicit``, $RFTSTACK_LOCK, the source tree's, or the packaged copy."""
    if explicit:
        if not Path(explicit).is_file():
            raise UserError(f"lock file {explicit} does not exist; pass the path of the project's uv.lock")
        return Path(explicit)
    for c in (os.environ.get("RFTSTACK_LOCK"), ROOT_DIR / "uv.lock", Path(__file__).parent.parent / "data" / "uv.lock"):
        if c and Path(c).is_file():
            return Path(c)
    raise UserError("no uv.lock found next to rftstack; pass --lock PATH (the project's uv.lock)")


def load(path: str | os.PathLike | None = None) -> Lock:
    path = find_lock(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not a valid uv.lock ({exc}); regenerate it with `uv lock`") from None
    if data.get("version") != 1:
        raise UserError(f"{path} is uv.lock version {data.get('version')!r}; this rftstack reads version 1")
    return Lock(data, path)


def current_environment() -> dict[str, str]:
    from packaging.markers import default_environment

    return dict(default_environment())


