"""Finding Nix for the tests that run it: on PATH, else the project's own installer
(.ci/install-nix.sh: Nix 2.26 from Debian's archive in a private prefix). The installer reuses an
existing prefix without downloading; it installs from scratch only under CI=true (what `.ci/run`
also does), elsewhere a missing Nix skips the test with the command that installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

INSTALLER = REPO / ".ci" / "install-nix.sh"


def default_prefix() -> Path:
    """The installer's default prefix (its NIX_PREFIX default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("NIX_PREFIX") or Path(cache) / "rftstack" / "nix-trixie")


def _exports(text: str) -> dict[str, str]:
    env = dict(os.environ)
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


def nix_env() -> dict[str, str]:
    """An environment in which `nix` and `nix-instantiate` run; skips (fails under CI) without Nix."""
    if shutil.which("nix-instantiate"):
        return dict(os.environ)
    if (default_prefix() / "usr" / "bin" / "nix").exists() or os.environ.get("CI"):
        r = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=600)
        if r.returncode == 0:
            return _exports(r.stdout)
        if os.environ.get("CI"):
            pytest.fail(f"Nix is not installed on this CI machine and .ci/install-nix.sh failed: {r.stderr[-2000:]}")
    pytest.skip("Nix is not installed (bash .ci/install-nix.sh installs it into a private prefix)")


def nix_eval_json(expr: str, env: dict[str, str]) -> object:
    """`nix-instantiate --eval --strict --json` of an expression, evaluated in the repository."""
    import json

    r = subprocess.run(["nix-instantiate", "--eval", "--strict", "--json", "--expr", expr],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)
