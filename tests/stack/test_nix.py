"""The flake's own checks, run with real Nix: every .nix file parses, the Nix-level tests of
nix/lib (policy and lock -> overlay decisions) and the closure invariants hold.

Nix comes from PATH or the project's installer (.ci/install-nix.sh, tests/nix_helpers.py); without
it this skips, except under CI=true, where the installer runs and a missing Nix is a failure.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from helpers import REPO
from nix_helpers import nix_env


def test_flake_checks_pass():
    r = subprocess.run(["bash", str(REPO / "nix" / "ci-check.sh")], capture_output=True, text=True, timeout=600,
                       env=nix_env(), cwd=REPO)
    out = r.stdout + r.stderr
    m = re.search(r"^(\d+) passed, (\d+) failed$", out, re.M)
    assert m, out[-3000:]
    passed, failed = map(int, m.groups())
    assert r.returncode == 0 and failed == 0, "\n".join(l for l in out.splitlines() if l.startswith("FAILED"))
    assert passed >= 70  # parses + nix tests + invariants + script checks; fewer means checks went missing


def _debian_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("deb.debian.org", 80), timeout=5).close()
        return True
    except OSError:
        return False


def test_installer_from_scratch_into_a_temporary_prefix(tmp_path):
    """.ci/install-nix.sh on this Debian machine into an empty prefix: Nix 2.26 runs from there, a
    second run reuses it, and nothing outside the prefix is configured (NIX_CONF_DIR)."""
    import os

    if not _debian_reachable():
        if os.environ.get("CI"):
            pytest.fail("deb.debian.org is not reachable from this CI machine; .ci/install-nix.sh needs Debian's archive")
        pytest.skip("deb.debian.org is not reachable")
    prefix = tmp_path / "nix"
    env = {**os.environ, "NIX_PREFIX": str(prefix)}
    first = subprocess.run(["bash", str(REPO / ".ci" / "install-nix.sh")], capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    exports = [l for l in first.stdout.splitlines() if l.startswith("export ")]
    assert exports == [f"export PATH={prefix}/usr/bin:$PATH", f"export NIX_CONF_DIR={prefix}/etc/nix"]
    version = subprocess.run([str(prefix / "usr/bin/nix"), "--version"], capture_output=True, text=True,
                             env={**os.environ, "NIX_CONF_DIR": str(prefix / "etc/nix")})
    assert version.returncode == 0 and version.stdout.startswith("nix (Nix) 2.26."), version.stdout + version.stderr
    parsed = subprocess.run([str(prefix / "usr/bin/nix-instantiate"), "--eval", "--expr", "1 + 1"], capture_output=True,
                            text=True, env={**os.environ, "NIX_CONF_DIR": str(prefix / "etc/nix")})
    assert parsed.stdout.strip() == "2", parsed.stderr
    again = subprocess.run(["bash", str(REPO / ".ci" / "install-nix.sh")], capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 0 and "already installed" in again.stderr


def test_installer_refuses_a_prefix_it_cannot_create(tmp_path):
    import os

    blocker = tmp_path / "file"
    blocker.write_text("")
    r = subprocess.run(["bash", str(REPO / ".ci" / "install-nix.sh")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NIX_PREFIX": str(blocker / "nix")})
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("install-nix: cannot create"), r.stderr
