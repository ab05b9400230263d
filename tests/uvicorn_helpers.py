"""uvicorn's httptools protocol as published and with patches/uvicorn-httptools-ignore-upgrade.patch,
without touching the venv: as a private module (in-process servers) or as a copy of the uvicorn
package in a directory put first on sys.path (a subprocess, e.g. Trinity's proxy host)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

from rftstack.stack import patches, policy

PATCH = "uvicorn-httptools-ignore-upgrade.patch"
REL = "uvicorn/protocols/http/httptools_impl.py"
MARK = "rftstack patch (patches/uvicorn-httptools-ignore-upgrade.patch)"


def _file_patch() -> patches.FilePatch:
    (p,) = [p for p in policy.load().patches if p.file == PATCH]
    (fp,) = patches.parse((patches.patches_dir() / p.file).read_text())
    return fp


def installed_source() -> Path:
    import uvicorn

    return Path(uvicorn.__file__).parents[1] / REL


def httptools_impl_text(patched: bool) -> str:
    """The installed module's text as published (reverse of the patch when applied) or patched."""
    text = patches.undo(installed_source().read_text(), patches.patches_dir() / PATCH, REL)
    assert MARK not in text
    return patches.apply_text(text, _file_patch())[0] if patched else text


def httptools_protocol(patched: bool, tmp: Path) -> type:
    """HttpToolsProtocol as published or patched, loaded as a private module (pass it as Config(http=...))."""
    name = f"httptools_impl_{'patched' if patched else 'published'}"
    if name not in sys.modules:
        path = tmp / f"{name}.py"
        path.write_text(httptools_impl_text(patched))
        spec = importlib.util.spec_from_file_location(name, path)
        mod: ModuleType = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name].HttpToolsProtocol


def uvicorn_site(dest: Path, patched: bool) -> Path:
    """``dest`` holding a copy of the installed uvicorn package with its httptools protocol as
    published or patched; put ``dest`` first on sys.path to run with it."""
    import uvicorn

    shutil.copytree(Path(uvicorn.__file__).parent, dest / "uvicorn", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / REL).write_text(httptools_impl_text(patched))
    return dest


def add_uvicorn(site: Path) -> Path:
    """``site`` gets uvicorn's httptools protocol as published and uvicorn's dist-info (METADATA and
    a RECORD naming that file): enough for rftstack's patch machinery."""
    import uvicorn

    (site / REL).parent.mkdir(parents=True, exist_ok=True)
    (site / REL).write_text(httptools_impl_text(patched=False))
    real_info = next(Path(uvicorn.__file__).parents[1].glob("uvicorn-*.dist-info"))
    (site / real_info.name).mkdir()
    shutil.copy(real_info / "METADATA", site / real_info.name / "METADATA")
    (site / real_info.name / "RECORD").write_text(f"{REL},,\n")
    return site
