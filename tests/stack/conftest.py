"""Fixtures shared by the proxy tests: the vLLM streaming TEST DOUBLE and copies of the installed trinity
package, original and with the policy's stream-record patch."""

from __future__ import annotations

import shutil
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
