"""The report's problems 1 and 2: the stack resolves, the lock is current, `pip check` is clean.

These run against the real uv.lock, real PyPI metadata (uv) and the real synced environment.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from packaging.version import Version

from helpers import REPO
from rftstack.stack import lockfile

UV = shutil.which("uv")
needs_uv = pytest.mark.skipif(UV is None, reason="uv is not on PATH (CI installs it)")


@pytest.fixture(scope="module")
def lock():
    return lockfile.load(REPO / "uv.lock")


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_lock_pins_the_stack_for_each_python(lock, python):
    pkgs = lock.resolve(lockfile.target_environment(python))
    v = {name: Version(p.version) for name, p in pkgs.items()}
    assert v["trinity-rft"] == Version("0.6.0")
    assert v["vllm"] == Version("0.23.0")  # >= 0.22: pack_tensors and a "checkpoint" backend
    assert v["verl"] == Version("0.8.0")
    assert (v["torch"], v["torchvision"], v["torchaudio"]) == (Version("2.11.0"), Version("0.26.0"), Version("2.11.0"))
    assert Version("2") <= v["numpy"] < Version("2.4")  # numpy 2 for opencv, < 2.4 for mistral-common
    assert v["opencv-python-headless"] >= Version("4.13")
    assert v["transformers"] >= Version("5.12.1")
    assert "greenlet" in pkgs  # trinity's undeclared need (policy [[add]])
    assert "ray" in pkgs and "aiohttp-cors" in pkgs  # ray[default] (dashboard) is followed


def test_every_locked_artifact_has_a_sha256(lock):
    for p in lock.packages:
        if p.is_root:
            continue
        arts = list(p.wheels) + ([p.sdist] if p.sdist else [])
        assert arts, f"{p.name} has nothing to install"
        for a in arts:
            assert len(a.sha256) == 64, f"{p.name}: {a.filename} has no sha256"


@needs_uv
def test_lock_is_current():
    """`uv lock --locked` fails when pyproject.toml and uv.lock disagree."""
    r = subprocess.run([UV, "lock", "--locked"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@needs_uv
def test_published_stack_does_not_resolve_without_our_override(tmp_path):
    """Problem 1/2 reproduced: trinity-rft[vllm]==0.6.0 as published has no solution on Python 3.12,
    because verl caps numpy<2 while every vllm in range needs opencv>=4.13, i.e. numpy>=2."""
    req = tmp_path / "req.in"
    req.write_text("trinity-rft[vllm]==0.6.0\n")
    r = subprocess.run(
        [UV, "pip", "compile", "--no-config", str(req), "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28", "--no-header"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode != 0
    assert "numpy" in r.stderr and "verl" in r.stderr, r.stderr[-2000:]
    # ... and with the one override the same request resolves.
    (tmp_path / "ov.txt").write_text("numpy>=2,<2.4\n")
    r = subprocess.run(
        [UV, "pip", "compile", "--no-config", str(req), "--override", str(tmp_path / "ov.txt"), "--python-version", "3.12",
         "--python-platform", "x86_64-manylinux_2_28", "--no-header", "--no-annotate"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verl==0.8.0" in r.stdout.split()


def test_installed_environment_matches_the_lock(lock):
    """Everything the lock installs for this interpreter is installed at the locked version."""
    import json

    from helpers import run_python

    # a fresh interpreter: this pytest process may have extra paths (setuptools puts its _vendor
    # directory, with its own packaging/zipp/... dist-infos, on sys.path once imported)
    r = run_python(
        """
        import importlib.metadata as md, json
        from rftstack.stack.policy import canonical
        out = {}
        for d in md.distributions():
            out.setdefault(canonical(d.metadata["Name"]), d.version)
        print(json.dumps(out))
        """
    )
    assert r.returncode == 0, r.stderr
    installed = json.loads(r.stdout)
    wanted = lock.resolve(lockfile.current_environment())
    wrong = {n: (p.version, installed.get(n)) for n, p in wanted.items() if not p.is_root and installed.get(n) != p.version}
    assert not wrong, f"installed differs from uv.lock (run `uv sync`): {wrong}"


@needs_uv
def test_pip_check_is_clean_after_relax():
    """After `rftstack relax` (CI runs it after `uv sync`), uv's pip check finds no incompatibility."""
    r = subprocess.run([UV, "pip", "check", "--python", sys.executable], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "All installed packages are compatible" in out, out
