"""bench/plot.py on JSON that bench/loadgen.py measured against a TEST DOUBLE server (figures named
"testdouble": real figures come only from GPU runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
from openai_double import OpenAIDouble  # noqa: E402
PNG = b"\x89PNG\r\n\x1a\n"


def _loadgen(url: str, label: str, out: Path) -> dict:
    r = subprocess.run([sys.executable, str(REPO / "bench/loadgen.py"), "--base-url", url, "--concurrency", "1,4,8",
                        "--requests", "16", "--max-tokens", "5", "--warmup", "0", "--label", label, "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def _plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench/plot.py"), *args], capture_output=True, text=True, timeout=120)


def test_plots_from_loadgen_and_serve_results(tmp_path):
    with OpenAIDouble(delay_s=0.002) as fast, OpenAIDouble(delay_s=0.02) as slow:
        a = _loadgen(fast.base_url, "testdouble-fast", tmp_path / "a.json")
        b = _loadgen(slow.base_url, "testdouble-slow", tmp_path / "b.json")
    figs = tmp_path / "figs"
    r = _plot("--out", str(figs), "--prefix", "testdouble", "--loadgen", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in figs.iterdir())
    assert names == ["testdouble-latency.png", "testdouble-ratio.png", "testdouble-throughput.png"]
    for p in figs.iterdir():
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000

    # the same data shaped as a serve_vs_bare.py result: per-model curves and the time-to-ready bars
    serve = {"label": "testdouble", "command": "test", "machine": {"host": "ci"}, "phases": {
        "bare": {"ready": {"ready": True, "first_answer_s": 10.0}, "load": a},
        "trinity": {"ready": {"ready": True, "first_answer_s": 14.0}, "load": b}}}
    (tmp_path / "serve-testdouble.json").write_text(json.dumps(serve))
    r = _plot("--out", str(figs), "--prefix", "serve", str(tmp_path / "serve-testdouble.json"))
    assert r.returncode == 0, r.stderr
    for n in ("serve-testdouble-throughput.png", "serve-testdouble-latency.png", "serve-testdouble-ratio.png", "serve-ready.png"):
        assert (figs / n).read_bytes()[:8] == PNG
    assert not any("spread" in p.name for p in figs.iterdir())

    # with spread-length loads (serve_vs_bare.py --spread) and the group-commit-off phase: three more figures
    serve["settings"] = {"spread": 0.75}
    serve["phases"]["bare"]["load_spread"] = a
    serve["phases"]["trinity"]["load_spread"] = b
    serve["phases"]["trinity-nogroup"] = {"load": b, "load_spread": b}
    (tmp_path / "serve-testdouble.json").write_text(json.dumps(serve))
    r = _plot("--out", str(tmp_path / "figs2"), "--prefix", "serve", str(tmp_path / "serve-testdouble.json"))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "figs2").iterdir())
    assert [n for n in names if "spread" in n] == ["serve-testdouble-spread-latency.png", "serve-testdouble-spread-ratio.png",
                                                  "serve-testdouble-spread-throughput.png"]


def test_no_inputs_and_bad_file_are_one_sentence(tmp_path):
    r = _plot("--out", str(tmp_path))
    assert r.returncode == 2 and "no input files" in r.stderr
    (tmp_path / "bad.json").write_text("{not json")
    r = _plot("--out", str(tmp_path), str(tmp_path / "bad.json"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
