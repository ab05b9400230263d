"""The package's layers, read from its source with ast: imports only go down, and no module cycle.

    cli, __main__                the command line (imports every part, lazily)
    run                          starting and watching the services; may use doctor, stack
    doctor                       what is wrong before anything starts; may use stack
    bundle                       getting the stack to an offline host; may use stack
    stack                        what is installed and how it is bent
    errors, findings, dotted,    shared by every part; import nothing of rftstack
    __init__

Every import counts, also those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import PYTHON_DIR

# part -> the parts it may import (besides itself and the shared base)
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "stack": set(),
    "doctor": {"stack"},
    "bundle": {"stack"},
    "run": {"doctor", "stack"},
    "cli": {"run", "doctor", "bundle", "stack"},
}
BASE = {"rftstack", "rftstack.errors", "rftstack.findings", "rftstack.dotted"}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (the folder holding the package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's own modules that ``name`` imports (submodules where ``from X import sub`` names one)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def part(module: str) -> str:
    if module in BASE:
        return "base"
    if module in ("rftstack.cli", "rftstack.__main__"):
        return "cli"
    return module.split(".")[1]


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(g.items()):
        mine = part(mod)
        for dep in sorted(deps):
            theirs = part(dep)
            if theirs in ("base", mine) or theirs in ALLOWED.get(mine, set()):
                continue
            bad.append(f"{mod} ({mine}) imports {dep} ({theirs})")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def test_every_module_is_in_a_part():
    g = graph(PYTHON_DIR)
    loose = [m for m in g if part(m) not in ALLOWED]
    assert loose == [], f"modules outside stack/, doctor/, run/, bundle/ and the shared base: {loose}"


def test_imports_only_go_down():
    assert layer_violations(graph(PYTHON_DIR)) == []


def test_no_import_cycles():
    assert cycles(graph(PYTHON_DIR)) == []


def test_the_checks_see_an_upward_import_and_a_cycle(tmp_path):
    """The rules above on a small package written here: stack importing run, and a cycle in run."""
    pkg = tmp_path / "rftstack"
    for rel, text in {
        "__init__.py": "",
        "errors.py": "",
        "stack/__init__.py": "",
        "stack/policy.py": "from rftstack.run import serve\n",
        "run/__init__.py": "",
        "run/serve.py": "def f():\n    from rftstack.run import supervisor\n",
        "run/supervisor.py": "from . import serve\nfrom rftstack.errors import UserError\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    g = graph(tmp_path)
    assert layer_violations(g) == ["rftstack.stack.policy (stack) imports rftstack.run.serve (run)"]
    assert cycles(g) == [["rftstack.run.serve", "rftstack.run.supervisor"]]
