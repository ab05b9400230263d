"""The vLLM APIs Trinity's serve path needs, checked by reading source with ``ast`` (nothing of
vLLM or Trinity is imported: ``import vllm`` alone takes many seconds and loads CUDA code).

Checked, all derived from Trinity's own files rather than a list typed here:
- every ``from vllm.X import name`` in Trinity's vLLM glue (``vllm_model.py``, ``vllm_extension.py``,
  ``vllm_worker.py``) resolves: the report's problem 5, ``pack_tensors`` missing from
  ``vllm/distributed/weight_transfer/packed_tensor.py`` in vllm < 0.22;
- ``WeightTransferConfig.backend`` accepts "checkpoint", which Trinity passes in serve mode (problem 4:
  vllm < 0.22 declares ``Literal["nccl", "ipc"]``);
- every method Trinity calls on ``self.async_llm`` (``init_weight_transfer_engine``,
  ``start_weight_update``, ``update_weights``, ``finish_weight_update``, ``collective_rpc``, ...) is
  defined by vLLM's ``AsyncLLM`` or its ``EngineClient`` base.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

from rftstack.findings import FAIL, OK, WARN, Finding

TRINITY_GLUE = ("common/models/vllm_model.py", "common/models/vllm_extension.py", "common/models/vllm_worker.py")
ASYNC_LLM = ("v1/engine/async_llm.py", "AsyncLLM")
ENGINE_CLIENT = ("engine/protocol.py", "EngineClient")


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # e.g. "vllm.distributed.weight_transfer.packed_tensor"
    name: str
    where: str  # "trinity/common/models/vllm_extension.py:21"


def vllm_imports(tree: ast.Module, where: str) -> list[Import]:
    """Every ``from vllm... import name`` anywhere in a module (also inside functions)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (node.module == "vllm" or node.module.startswith("vllm.")):
            out.extend(Import(node.module, a.name, f"{where}:{node.lineno}") for a in node.names)
    return out


def _top_level(stmts):
    """Statements at module level, looking into if/try/with blocks (TYPE_CHECKING, fallbacks)."""
    for s in stmts:
        yield s
        for attr in ("body", "orelse", "finalbody"):
            if isinstance(s, (ast.If, ast.Try, ast.With)) and hasattr(s, attr):
                yield from _top_level(getattr(s, attr))
        if isinstance(s, ast.Try):
            for h in s.handlers:
                yield from _top_level(h.body)


def defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for s in _top_level(tree.body):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(s.name)
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(s, (ast.AnnAssign, ast.AugAssign)) and isinstance(s.target, ast.Name):
            names.add(s.target.id)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            for a in s.names:
                names.add((a.asname or a.name).split(".")[0])
    return names


def module_file(root: Path, module: str) -> Path | None:
    """vllm.a.b -> <root>/a/b.py or <root>/a/b/__init__.py (root is the vllm package dir)."""
    parts = module.split(".")[1:]
    base = root.joinpath(*parts) if parts else root
    for p in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
        if p is not None and p.is_file():
            return p
    return None


def resolve(imp: Import, vllm_root: Path) -> str | None:
    """None when ``imp`` resolves in the vLLM sources; else why not (one phrase)."""
    f = module_file(vllm_root, imp.module)
    if f is None:
        return f"module {imp.module} does not exist"
    if module_file(vllm_root, f"{imp.module}.{imp.name}") is not None:
        return None  # a submodule
    names = defined_names(_parse(f))
    if imp.name in names:
        return None
    if "__getattr__" in names and imp.name in f.read_text(encoding="utf-8"):
        return None  # a lazily exported name (vllm/__init__.py style)
    return f"{imp.module} ({f.relative_to(vllm_root.parent)}) defines no {imp.name}"


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for s in _top_level(tree.body):
        if isinstance(s, ast.ClassDef) and s.name == name:
            return s
    return None


def backend_accepts(annotation: ast.expr | None, value: str) -> bool:
    """Whether a pydantic field annotation admits the string ``value``: ``str`` anywhere in it, or
    ``value`` among its Literal members. No annotation: anything goes."""
    if annotation is None:
        return True
    for n in ast.walk(annotation):
        if isinstance(n, ast.Name) and n.id == "str":
            return True
        if isinstance(n, ast.Constant) and n.value == value:
            return True
    return False


def field_annotation(cls: ast.ClassDef, field: str) -> ast.expr | None:
    for s in cls.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == field:
            return s.annotation
    raise KeyError(field)


def async_llm_calls(tree: ast.Module) -> dict[str, int]:
    """Methods Trinity calls on ``self.async_llm`` (``self.async_llm.X(...)``) -> first line."""
    out: dict[str, int] = {}
    for c in ast.walk(tree):
        n = c.func if isinstance(c, ast.Call) else None
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "async_llm" \
                and isinstance(n.value.value, ast.Name) and n.value.value.id == "self":
            out.setdefault(n.attr, n.lineno)
    return out


def class_members(cls: ast.ClassDef) -> set[str]:
    names = set()
    for s in cls.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(s.name)
        elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            names.add(s.target.id)
        elif isinstance(s, ast.Assign):
            names.update(t.id for t in s.targets if isinstance(t, ast.Name))
    for n in ast.walk(cls):  # self.x = ... in any method
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def check(trinity_root: Path | None, vllm_root: Path | None, vllm_version: str = "?") -> list[Finding]:
    if trinity_root is None or vllm_root is None:
        missing = " and ".join(n for n, r in (("trinity-rft", trinity_root), ("vllm", vllm_root)) if r is None)
        return [Finding("vllm-api", FAIL, f"{missing} is not installed in this Python environment.",
                        "Install the locked stack (`uv sync --frozen`, or run the flake's `nix run .#serve`).")]
    out = []
    trees = {}
    for rel in TRINITY_GLUE:
        p = trinity_root / rel
        if p.is_file():
            trees[rel] = _parse(p)
    # 1. imports
    broken = []
    imports = [i for rel, t in trees.items() for i in vllm_imports(t, f"trinity/{rel}")]
    for imp in imports:
        why = resolve(imp, vllm_root)
        if why:
            broken.append((imp, why))
    if broken:
        first, why = broken[0]
        more = f" ({len(broken) - 1} more)" if len(broken) > 1 else ""
        out.append(Finding(
            "vllm-api.imports", FAIL,
            f"Trinity's `from {first.module} import {first.name}` ({first.where}) fails with vllm {vllm_version}: {why}{more}.",
            "Install vllm 0.22 or newer (the lock pins 0.23.0); Trinity 0.6.0's serve path was written against it.",
            {"broken": [{**dataclasses.asdict(i), "why": w} for i, w in broken]},
        ))
    else:
        out.append(Finding("vllm-api.imports", OK, f"All {len(imports)} vLLM names Trinity's serve path imports exist in vllm {vllm_version}.", "", {"imports": len(imports)}))
    # 2. WeightTransferConfig.backend
    wt = module_file(vllm_root, "vllm.config.weight_transfer")
    cls = _class(_parse(wt), "WeightTransferConfig") if wt else None
    if cls is None:
        out.append(Finding("vllm-api.weight_transfer_backend", FAIL, f"vllm {vllm_version} has no WeightTransferConfig (vllm/config/weight_transfer.py), which Trinity's serve mode builds.",
                           "Install vllm 0.22 or newer (the lock pins 0.23.0)."))
    else:
        try:
            ann = field_annotation(cls, "backend")
        except KeyError:
            ann = None
        text = ast.unparse(ann) if ann is not None else "(unannotated)"
        if backend_accepts(ann, "checkpoint"):
            out.append(Finding("vllm-api.weight_transfer_backend", OK, f"WeightTransferConfig.backend is `{text}` in vllm {vllm_version}, so Trinity's backend=\"checkpoint\" is accepted.", "", {"annotation": text}))
        else:
            out.append(Finding("vllm-api.weight_transfer_backend", FAIL,
                               f"WeightTransferConfig.backend is `{text}` in vllm {vllm_version}, so serve mode (sync_method forced to checkpoint) fails with \"Input should be 'nccl' or 'ipc'\".",
                               "Install vllm 0.22 or newer (the lock pins 0.23.0); do not patch Trinity to \"ipc\", that only moves the failure to `pack_tensors`.",
                               {"annotation": text}))
    # 3. AsyncLLM methods
    model_tree = trees.get(TRINITY_GLUE[0])
    calls = async_llm_calls(model_tree) if model_tree else {}
    members = set()
    for rel, name in (ASYNC_LLM, ENGINE_CLIENT):
        f = vllm_root / rel
        c = _class(_parse(f), name) if f.is_file() else None
        if c is not None:
            members |= class_members(c)
    missing = sorted(a for a in calls if a not in members)
    if missing:
        out.append(Finding("vllm-api.async_llm", FAIL,
                           f"vllm {vllm_version}'s AsyncLLM lacks {', '.join(missing)}, which Trinity calls (trinity/{TRINITY_GLUE[0]}).",
                           "Install vllm 0.22 or newer (the lock pins 0.23.0).", {"missing": missing}))
    elif calls:
        out.append(Finding("vllm-api.async_llm", OK, f"vllm {vllm_version}'s AsyncLLM has all {len(calls)} methods Trinity calls, weight updates included.", "", {"calls": sorted(calls)}))
    else:
        out.append(Finding("vllm-api.async_llm", WARN, "Trinity's vllm_model.py calls nothing on self.async_llm; this Trinity is not 0.6.0.",
                           "Install the locked trinity-rft 0.6.0."))
    return out
