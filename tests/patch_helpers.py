"""A temporary site-packages holding a copy of the installed torch's real rendezvous.py (as
published: un-patched with the policy patch's reverse when the venv's torch is patched already, as
in CI after `rftstack relax`) and torch's real dist-info. The venv itself is never written."""

from __future__ import annotations

import shutil
from pathlib import Path

from rftstack import patches, policy

TORCH_REL = "torch/distributed/rendezvous.py"


def torch_patch():
    (p,) = [p for p in policy.load().patches if p.dist == "torch"]
    return p


def original_rendezvous() -> str:
    import torch

    text = (Path(torch.__file__).parent / "distributed" / "rendezvous.py").read_text()
    if "_loopback_listen_fd" in text:
        for fp in patches.parse((patches.patches_dir() / torch_patch().file).read_text()):
            back = patches.FilePatch(fp.path, [patches.Hunk(h.old_start, h.after, h.before) for h in fp.hunks])
            text = patches.apply_text(text, back)[0]
    assert "_loopback_listen_fd" not in text
    return text


def add_torch(site: Path) -> Path:
    import torch

    real_site = Path(torch.__file__).parent.parent
    (site / "torch" / "distributed").mkdir(parents=True)
    (site / TORCH_REL).write_text(original_rendezvous())
    real_info = next(real_site.glob("torch-*.dist-info"))
    shutil.copytree(real_info, site / real_info.name, ignore=shutil.ignore_patterns("licenses", "LICENSE*"))
    return site
