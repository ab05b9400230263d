"""The flake's auto-patchelf plan against the real ELF files of the synced stack.

nixpkgs' auto-patchelf searches only ``<input>/lib`` of a package's buildInputs; the wheels keep
their libraries under site-packages (torch/lib, nvidia/cu13/lib, ...), so the flake adds search
paths per package (nix/lib/autopatchelf.nix, exported by the flake as ``lib.autoPatchelf``). Here
the plan is read from Nix's own evaluation of nix/lib (no nixpkgs needed) and every DT_NEEDED of
every x86-64 ELF file of this environment (the lock's CUDA 13 wheels, as `uv sync --locked`
installs them) is resolved against exactly what the plan gives the distribution that owns it.
Guards an upstream behaviour (auto-patchelf's search path): the plan without its search paths,
as the flake had it, is shown to fail on the same files.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

from nix_helpers import nix_env, nix_eval_json
from rftstack.stack import autopatchelf

RS = ("import ./nix/lib { policyFile = ./python/rftstack/data/policy.toml; lockFile = ./uv.lock; "
      "patchesDir = ./patches; }")


@pytest.fixture(scope="module")
def flake_plan() -> dict:
    env = nix_env()
    return nix_eval_json(f"let rs = {RS}; in {{ plan = rs.autoPatchelf; libraries = rs.libraries; "
                         "artifacts = builtins.attrNames rs.artifacts; }", env)


@pytest.fixture(scope="module")
def site() -> Path:
    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "torch" / "lib").is_dir():
        if os.environ.get("CI"):
            pytest.fail("torch is not installed in the test environment; run `uv sync --locked` first")
        pytest.skip("the synced stack (uv sync --locked) is not installed here")
    return site


def _sentence(report: autopatchelf.Report) -> str:
    lines = [f"{m.library} (needed by {m.file} of {m.dist})" for m in report.missing[:40]]
    return f"{len(report.missing)} libraries auto-patchelf would not find:\n" + "\n".join(lines)


def test_cuda13_flavour_resolves_every_needed_library(flake_plan, site):
    report = autopatchelf.unresolved(site, flake_plan["plan"]["cuda13"], flake_plan["libraries"], sys.version_info.minor)
    assert not report.missing, _sentence(report)
    # not vacuous: the CUDA binaries were among the files resolved
    assert {"torch", "vllm", "torchvision", "torchaudio", "nvidia-cusolver"} <= set(report.dists)
    assert report.files > 300, report.files


def test_shared_wheels_of_the_driver570_flavour_resolve(flake_plan, site):
    """The wheels both flavours install (all but the CUDA 12 artifacts, which are not at hand here,
    and the CUDA 13 dists the driver-570 flavour drops) against the driver-570 plan."""
    report = autopatchelf.unresolved(site, flake_plan["plan"]["cuda12"], flake_plan["libraries"], sys.version_info.minor,
                                     not_at_hand=tuple(flake_plan["artifacts"]))
    assert not report.missing, _sentence(report)
    assert "torch" in report.skipped and "nvidia-cublas" in report.skipped and "torch" not in report.dists
    assert "torch-c-dlpack-ext" in report.dists


def test_without_search_paths_libtorch_and_cudart_are_missing(flake_plan, site):
    """The flake before search paths: only buildInputs' lib/ folders, where no wheel keeps its libraries."""
    bare = {d: {**p, "searchPaths": []} for d, p in flake_plan["plan"]["cuda13"].items()}
    report = autopatchelf.unresolved(site, bare, flake_plan["libraries"], sys.version_info.minor)
    found = {(m.dist, m.library) for m in report.missing}
    assert ("vllm", "libtorch.so") in found and ("torchvision", "libc10.so") in found
    assert ("torch", "libcudart.so.13") in found and ("nvidia-cusolver", "libcublas.so.13") in found
