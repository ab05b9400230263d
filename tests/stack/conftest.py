"""Fixtures shared by the proxy tests: the vLLM streaming TEST DOUBLE and copies of the installed trinity
package, original and with the policy's stream-record patch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from doubles.vllm_stream_double import VLLMStreamDouble
from patch_helpers import add_trinity_proxy
from rftstack.stack import patches
from rftstack.stack import policy


@pytest.fixture(scope="module")
def double():
    with VLLMStreamDouble() as d:
        yield d


def _trinity_copy(tmp_path_factory, name: str) -> Path:
    """A copy of the installed trinity package whose proxy app.py is Trinity's original (whatever the
    environment's `rftstack relax` did to the installed one)."""
    import trinity

    site = tmp_path_factory.mktemp(name)
    shutil.copytree(Path(trinity.__file__).parent, site / "trinity", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "trinity/explorer/proxy/app.py").unlink()
    add_trinity_proxy(site)  # the original app.py and trinity-rft's dist-info
    return site


@pytest.fixture(scope="module")
def original_site(tmp_path_factory) -> Path:
    return _trinity_copy(tmp_path_factory, "original")


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory) -> Path:
    """The same copy with the policy's stream-record patch applied by patches.apply, after the
    store-errors patch it builds on (the policy's order)."""
    site = _trinity_copy(tmp_path_factory, "site")
    for name in ("trinity-proxy-store-errors.patch", "trinity-proxy-stream-record.patch"):
        (p,) = [p for p in policy.load().patches if p.file == name]
        assert patches.apply(site, patches.patches_dir() / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version) == [
            ("trinity/explorer/proxy/app.py", "applied")]
    return site


def policy_chain_site(tmp_path_factory, name: str, leave_out: str | None = None) -> Path:
    """Trinity's original files with every trinity-rft patch of the policy applied in its order
    (the install's chain), except ``leave_out``."""
    site = _trinity_copy(tmp_path_factory, name)
    for p in policy.load().patches:
        if p.dist == "trinity-rft" and p.file != leave_out:
            patches.apply(site, patches.patches_dir() / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version)
    return site


@pytest.fixture(scope="module")
def policy_site(tmp_path_factory) -> Path:
    """Every trinity-rft patch of the policy, as `rftstack relax` applies them."""
    return policy_chain_site(tmp_path_factory, "policy")


@pytest.fixture(scope="module")
def site_without_marks(tmp_path_factory) -> Path:
    """The policy's chain without trinity-proxy-commit-marks.patch (Trinity's own commit path)."""
    site = policy_chain_site(tmp_path_factory, "no-marks", leave_out="trinity-proxy-commit-marks.patch")
    assert "restore_uncommitted" not in (site / "trinity/explorer/proxy/service.py").read_text()
    return site


@pytest.fixture
def full_fs(tmp_path):
    """A 256 KiB tmpfs under ``tmp_path`` (skipped where it cannot be mounted: it needs root), unmounted after."""
    mnt = tmp_path / "store"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
