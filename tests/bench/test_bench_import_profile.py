"""bench/import_profile.py's parser on real `python -X importtime` output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
import import_profile  # noqa: E402


def test_parse_real_importtime_output():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json, email.parser"], capture_output=True, text=True)
    parsed = import_profile.parse_importtime(r.stderr)
    assert parsed["modules"] > 10
    own = parsed["by_package_us"]
    assert "json" in own and "email" in own
    # the distributions' own times add up to no more than the total (nested entries are not double counted)
    assert sum(own.values()) <= parsed["total_us"] * 1.01 + 1000


def test_source_state_compiles_from_source(tmp_path):
    """In the "source" state no bytecode is written: profile() removes its cache prefix with rmdir, which fails if not empty."""
    row = import_profile.profile("json", state="source", python=sys.executable)
    assert row["rc"] == 0 and row["modules"] > 3
