"""bench/anyio_root.py: bad input is one sentence and exit 2; a short real run (its own loopback Ray head, the probe's
real Ray actor with the patch on and off) writes the rounds, both orders' results and their ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO

SCRIPT = REPO / "bench" / "anyio_root.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_bad_input_is_one_sentence(tmp_path):
    out = run("--out", str(tmp_path / "r.json"), "--rounds", "0")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "anyio_root: --rounds, --requests and --concurrency must be at least 1"]
    assert not (tmp_path / "r.json").exists()


def test_a_short_run_compares_the_patch_on_and_off(tmp_path):
    out = run("--out", str(tmp_path / "r.json"), "--rounds", "2", "--requests", "40", "--concurrency", "4")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert [x["order"] for x in r["rounds"]] == [["on", "off"], ["off", "on"]]
    for x in r["rounds"]:
        assert x["on"]["switch"] is True and x["off"]["switch"] is False
        assert x["on"]["answered"] == x["off"]["answered"] == 40 and x["on"]["load"] == x["off"]["load"] == 0
        assert x["off"]["threads"] > x["on"]["threads"]
        assert x["ratio_on_off"] == round(x["on"]["requests_per_s"] / x["off"]["requests_per_s"], 3)
    assert "patch on / off:" in out.stdout
