"""The driver-570 invariant "no CUDA 13 dist in the closure", on mutated locks (real Nix evaluation
of nix/lib/invariants.nix), and on the real ELF files of the synced stack.

NVIDIA's CUDA 13 wheels on PyPI carry no `-cu13` suffix (nvidia-cublas 13.x, nvidia-nvjpeg 13.x):
the invariant judges a dist by the CUDA major of its version, not only by its name. A lock in
which verl gains nvidia-nvjpeg 13.0.1.86 (either spelling) must fail it with a sentence.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO
from nix_helpers import nix_env, nix_eval_json

GUARD = "no-cuda13-dist-in-driver570-closure"


def _mutated_lock(tmp_path: Path, dist: str, version: str) -> Path:
    """uv.lock with verl depending on ``dist`` ``version`` (a wheel entry that is never fetched)."""
    text = (REPO / "uv.lock").read_text()
    text, n = re.subn(r'(\nname = "verl"\nversion = "0\.8\.0"\n[^\n]*\ndependencies = \[\n)',
                      rf'\1    {{ name = "{dist}" }},\n', text, count=1)
    assert n == 1, "verl's dependency list was not found in uv.lock"
    file = dist.replace("-", "_")
    text += (f'\n[[package]]\nname = "{dist}"\nversion = "{version}"\nsource = {{ registry = "https://pypi.org/simple" }}\n'
             f'wheels = [\n    {{ url = "https://files.pythonhosted.org/packages/00/00/{file}-{version}-py3-none-manylinux_2_27_x86_64.whl", '
             f'hash = "sha256:{"0" * 64}", size = 1 }},\n]\n')
    lock = tmp_path / "uv.lock"
    lock.write_text(text)
    return lock


def _guard(lock: Path) -> dict:
    rs = (f"import ./nix/lib {{ policyFile = ./python/rftstack/data/policy.toml; lockFile = {lock}; "
          "patchesDir = ./patches; }")
    results = nix_eval_json(f"import ./nix/lib/invariants.nix ({rs})", nix_env())
    return next(r for r in results if r["name"] == GUARD)


@pytest.mark.parametrize("dist", ["nvidia-nvjpeg", "nvidia-nvjpeg-cu13"])
def test_verl_gaining_a_cuda13_nvjpeg_fails_the_invariant(tmp_path, dist):
    result = _guard(_mutated_lock(tmp_path, dist, "13.0.1.86"))
    assert not result["ok"]
    assert result["message"].startswith("CUDA 13 distributions are still reachable in the driver-570 closure")
    assert dist in result["message"]


def test_a_cuda12_nvjpeg_passes_the_invariant(tmp_path):
    """Not everything nvidia-* is refused: a CUDA 12 wheel of the same library passes."""
    assert _guard(_mutated_lock(tmp_path, "nvidia-nvjpeg-cu12", "12.3.5.92"))["ok"]


def test_the_real_lock_passes_the_invariant(tmp_path):
    assert _guard(REPO / "uv.lock")["ok"]


def test_no_wheel_at_hand_in_the_driver570_closure_links_cuda13():
    """Where the wheel is at hand (this synced env), its ELF files' CUDA runtime sonames
    (libcudart.so.N, libcublas.so.N, ...) decide: none of the driver-570 closure's dists may be CUDA 13
    (the CUDA 12 artifacts replace torch/vllm/torchvision/torchaudio and are not at hand here)."""
    import importlib.metadata as md

    from packaging.utils import canonicalize_name

    from rftstack.stack import elf

    rs = "import ./nix/lib { policyFile = ./python/rftstack/data/policy.toml; lockFile = ./uv.lock; }"
    data = nix_eval_json(f"let rs = {rs}; in {{ names = rs.flavours.cuda12.names; "
                         "artifacts = builtins.attrNames rs.artifacts; cuda13 = rs.flavours.cuda13.names; }", nix_env())
    closure = set(data["names"]) - set(data["artifacts"])
    dists = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions()}
    if "torch" not in dists:
        pytest.skip("the synced stack (uv sync --locked) is not installed here")
    found = {n: elf.scan_dist(dists[n]) for n in sorted(set(data["cuda13"]) & set(dists))}
    cuda13 = {n: f for n, f in found.items() if f and f.cuda_major >= 13}
    assert {"torch", "nvidia-cublas", "nvidia-cusolver"} <= set(cuda13)  # the check sees CUDA 13 where it is
    leaked = {n: f"{f.example} needs {f.lib}" for n, f in cuda13.items() if n in closure}
    assert not leaked, f"CUDA 13 binaries in the driver-570 closure: {leaked}"
