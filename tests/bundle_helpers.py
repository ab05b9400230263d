"""Helpers for the bundle tests: small real projects whose uv.lock is a subset of the real one."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL_LOCK = REPO / "uv.lock"


def lock_blocks(text: str) -> dict[str, str]:
    """name -> the [[package]] block of the real uv.lock (first version when there are several)."""
    head, *blocks = text.split("\n[[package]]\n")
    out: dict[str, str] = {}
    for b in blocks:
        name = re.search(r'^name = "([^"]+)"', b, re.M).group(1)
        out.setdefault(name, b.rstrip("\n"))
    return out


def make_project(root: Path, deps: list[str], name: str = "bundle-probe") -> Path:
    """A buildable project at ``root`` whose uv.lock holds ``deps`` copied verbatim from the real
    lock (their own dependencies must be among ``deps``)."""
    blocks = lock_blocks(REAL_LOCK.read_text())
    root.mkdir(parents=True, exist_ok=True)
    mod = name.replace("-", "_")
    (root / mod).mkdir(exist_ok=True)
    (root / mod / "__init__.py").write_text('VALUE = "bundled"\n')
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        f"dependencies = {deps!r}\n\n"
        '[build-system]\nrequires = ["hatchling>=1.25"]\nbuild-backend = "hatchling.build"\n\n'
        f'[tool.hatch.build.targets.wheel]\npackages = ["{mod}"]\n'.replace("'", '"')
    )
    root_block = (
        f'name = "{name}"\nversion = "0.1.0"\nsource = {{ editable = "." }}\ndependencies = [\n'
        + "".join(f'    {{ name = "{d}" }},\n' for d in deps)
        + "]\n"
    )
    pkgs = {d: blocks[d] for d in deps}
    pkgs[name] = root_block.rstrip("\n")
    text = 'version = 1\nrevision = 3\nrequires-python = ">=3.11"\n'
    for n in sorted(pkgs):
        text += "\n[[package]]\n" + pkgs[n] + "\n"
    (root / "uv.lock").write_text(text)
    return root / "uv.lock"
