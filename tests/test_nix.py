"""The flake's own checks, run with real Nix: every .nix file parses, the Nix-level tests of
nix/lib (policy and lock -> overlay decisions) and the closure invariants hold.

Nix comes from PATH or the project's installer (.ci/install-nix.sh, tests/nix_helpers.py); without
it this skips, except under CI=true, where the installer runs and a missing Nix is a failure.
"""

from __future__ import annotations

import re
import subprocess

from conftest import REPO
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
