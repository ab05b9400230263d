"""bench/proxy_overhead.py: Trinity's real proxy app and SQLite recorder in front of a TEST DOUBLE
upstream record every response (the numbers themselves go to docs/benchmarks.md, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_proxy_forwards_and_records_every_response(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(out), "--variants", "sqlite",
                        "--concurrency", "2", "--requests", "10", "--max-tokens", "5"],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    run = res["runs"]["sqlite"]
    assert run["levels"][0]["ok"] == 10 and run["levels"][0]["errors"] == 0
    assert run["levels"][0]["output_tokens"] == 50
    assert run["recorded_rows"] == 8 + 10  # 8 warm-up requests + the measured ones, one row each
    assert res["summary"]["sqlite"]["2"]["vs_direct"] > 0


def test_unknown_variant_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(tmp_path / "x.json"),
                        "--variants", "postgres"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "unknown variant 'postgres'" in r.stderr and "Traceback" not in r.stderr
