"""bench/startup_timeline.py on the real serve logs of the 2026-11-29b H200 run (and an earlier one).

The expected values below were read by hand from the log lines they cite.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
import startup_timeline as st

RUNS = REPO / "docs" / "gpu-logs" / "2026-11-29b" / "runs"
PREV18 = REPO / "tests" / "fixtures" / "startup" / "prev18-rl0"


def phase(res: dict, key: str) -> dict:
    return next(p for p in res["phases"] if p["key"] == key)


def span(res: dict, key: str) -> dict:
    return next(s for s in res["spans"] if s["key"] == key)


@pytest.mark.parametrize("run,ready_after", [("bench-trinity", 145), ("rl", 188), ("soak", 182)])
def test_ready_offset_matches_serves_own_count(run, ready_after):
    res = st.analyse(RUNS / run)
    assert res["ready"] and res["missing"] == [] and res["warnings"] == []
    # serve.log: "READY after 145 s" (bench-trinity), 188 (rl), 182 (soak), counted from its first line
    assert res["ready_after_s_reported"] == ready_after
    assert abs(res["ready_offset_s"] - ready_after) <= 1
    # every marker is present, in the expected order (monotonic), and the gaps add up to READY
    offsets = [p["offset_s"] for p in res["phases"]]
    assert offsets == sorted(offsets)
    assert sum(p["duration_s"] or 0 for p in res["phases"]) == pytest.approx(res["ready_offset_s"], abs=1e-6)
    assert sum(res["groups_s"].values()) == pytest.approx(res["ready_offset_s"], abs=1e-6)


def test_bench_trinity_phases_by_hand():
    res = st.analyse(RUNS / "bench-trinity")
    # serve.log starts 23:07:57; "starting Ray head" 23:08:06; "Ray head answers ... after 7 s" 23:08:13
    assert phase(res, "ray_start")["offset_s"] == 9
    assert phase(res, "ray_ready")["offset_s"] == 16
    assert span(res, "ray_head")["seconds"] == 7 == span(res, "ray_head")["reported_s"]
    # trinity.log: "Connected to Ray cluster" at 23:08:20,679 (ms resolution), 23.679 s after 23:07:57
    assert phase(res, "ray_connected")["offset_s"] == pytest.approx(23.679)
    # "(Explorer pid=1044) ... 23:08:33 Finished initializing Explorer"
    assert phase(res, "explorer_init")["offset_s"] == 36
    # "(vLLMRolloutModel pid=1139) WARNING 11-29 23:08:45" is the engine actor's first line
    assert phase(res, "engine_first")["offset_s"] == 48
    # EngineCore's first line 23:08:55, Worker's 23:09:06: 11 s of Worker spawn + imports
    assert phase(res, "enginecore_first")["duration_s"] == 11
    # "Model loading took" 23:09:08 -> "init engine ... took 23.79 s" 23:09:31: 23 s by the 1-s stamps
    eng = span(res, "engine_init")
    assert eng["reported_s"] == 23.79 and abs(eng["seconds"] - 23.79) < 1.5
    assert phase(res, "compiled")["reported_s"] == 12.16
    # "All models are ready" 23:10:07 (130 s); "Rollout coordinator is ready" 23:10:21 (144 s)
    assert phase(res, "models_ready")["offset_s"] == 130
    assert phase(res, "coordinator_ready")["offset_s"] == 144
    # uvicorn's lines carry no timestamp: inferred from the same process's previous line, and said so
    up = phase(res, "api_up")
    assert up["inferred_time"] and up["offset_s"] == 130
    assert phase(res, "proxy_listening")["inferred_time"]
    # the unlogged 36 s between engine init and the API server is charged to start-up/imports
    assert phase(res, "engine_init")["duration_s"] == 36 and phase(res, "engine_init")["category"] == "engine"


def test_soak_engine_init_matches_vllms_own_number():
    res = st.analyse(RUNS / "soak")
    eng = span(res, "engine_init")
    # "(EngineCore pid=9058) INFO 11-29 22:55:02 [core.py:306] init engine (...) took 27.37 s"
    assert eng["reported_s"] == 27.37
    # "Model loading took" 22:54:35 -> 22:55:02 = 27 s (1-s stamps)
    assert eng["seconds"] == 27 and abs(eng["seconds"] - eng["reported_s"]) < 1.5


def test_rl_phases_by_hand():
    res = st.analyse(RUNS / "rl")
    # serve.log t=0 22:46:52; "Creating inference_model" 22:47:36; vLLMRolloutModel first line 22:47:49;
    # "Resolved architecture" 22:48:07; EngineCore 22:48:19; Worker 22:48:29
    assert phase(res, "engine_created")["offset_s"] == 44
    assert phase(res, "engine_created")["duration_s"] == 13
    assert phase(res, "engine_first")["duration_s"] == 18
    assert phase(res, "engine_config")["duration_s"] == 12
    assert phase(res, "enginecore_first")["duration_s"] == 10
    assert span(res, "engine_init")["seconds"] == 30 and span(res, "engine_init")["reported_s"] == 30.10
    assert phase(res, "coordinator_first")["offset_s"] == 181  # 22:49:53
    assert phase(res, "proxy_start")["offset_s"] == 188  # 22:50:00 "Starting Trinity Service on"


def test_term_run_stopped_while_loading():
    res = st.analyse(RUNS / "term")
    assert not res["ready"] and res["ready_offset_s"] is None
    assert res["stopped"].startswith("SIGTERM received")
    # the engine got as far as "Starting to load model" (22:52:38 = 101 s after 22:50:57); nothing later is invented
    assert phase(res, "load_start")["present"] and phase(res, "load_start")["offset_s"] == 101
    for key in ("model_loaded", "engine_init", "models_ready", "proxy_start", "ready"):
        p = phase(res, key)
        assert not p["present"] and p["offset_s"] is None and p["duration_s"] is None
        assert key in res["missing"]
    assert res["phases"][-1]["key"] == "stopped" and res["phases"][-1]["offset_s"] == 101
    assert span(res, "engine_init")["seconds"] is None
    out = st.render(res)
    assert "not READY: SIGTERM received" in out and "missing" in out


def test_logs_subdirectory_layout_and_missing_preflight():
    """A serve run directory as serve writes it (logs/serve.log); this older serve had no preflight line."""
    res = st.analyse(PREV18)
    assert res["ready_after_s_reported"] == 272 and res["ready_offset_s"] == 272
    assert res["missing"] == ["preflight"]
    assert span(res, "engine_init")["reported_s"] == 28.23 and span(res, "engine_init")["seconds"] == 29


def test_trinity_clock_in_another_zone_is_corrected(tmp_path):
    """trinity.log written one hour ahead (local time UTC+1): serve's quoted lines give the offset away."""
    src = RUNS / "bench-trinity"
    shutil.copy(src / "serve.log", tmp_path / "serve.log")
    text = (src / "trinity.log").read_text()
    text = text.replace(" 11-29 23:", " 11-30 00:").replace("2026-11-29 23:", "2026-11-30 00:")
    (tmp_path / "trinity.log").write_text(text)
    serve = (tmp_path / "serve.log").read_text().replace(" 11-29 23:", " 11-30 00:")
    (tmp_path / "serve.log").write_text(serve)
    res = st.analyse(tmp_path)
    assert res["trinity_clock_offset_s"] == 3600
    ref = st.analyse(src)
    assert [p["offset_s"] for p in res["phases"]] == [p["offset_s"] for p in ref["phases"]]


def test_bad_input_one_sentence_exit_2(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "startup_timeline.py"), str(tmp_path)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and r.stdout == ""
    err = r.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("startup_timeline: ") and "serve.log" in err
    # serve.log alone (a run refused by the preflight, like runs/busy) is not enough either
    r = subprocess.run([sys.executable, str(REPO / "bench" / "startup_timeline.py"), str(RUNS / "busy")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "trinity.log" in r.stderr and r.stderr.count("\n") == 1


def test_cli_json(tmp_path):
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "startup_timeline.py"), str(RUNS / "rl"),
                        str(RUNS / "term"), "--json", str(out)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "READY at 188 s" in r.stdout and "not READY" in r.stdout
    data = json.loads(out.read_text())
    assert [Path(x["run_dir"]).name for x in data["runs"]] == ["rl", "term"]


def test_a_marker_logged_ahead_of_its_place_runs_beside_the_timeline(tmp_path):
    """Session H's warm serve (docs/gpu-logs/2026-12-02h/runs-qwen3b-warm.tgz): the rollout coordinator is
    created while the models start (trinity-coordinator-early.patch), so its first line (20 s) is logged long
    before the weight-sync group (51 s) that precedes it in upstream's order. It is marked parallel and takes
    no gap: every gap is >= 0 and the groups add up to the last marker; serve's newer "Ray head answered"
    line is found."""
    import tarfile

    with tarfile.open(REPO / "docs" / "gpu-logs" / "2026-12-02h" / "runs-qwen3b-warm.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    res = st.analyse(tmp_path / "trinity-run")
    coord = phase(res, "coordinator_first")
    assert coord["present"] and coord.get("parallel") and coord["duration_s"] is None and coord["offset_s"] == 20
    assert any(n.startswith("coordinator_first (20.0 s) is logged before sync_group (51.0 s)") for n in res["parallel"])
    chain = [p for p in res["phases"] if p["present"] and not p.get("parallel")]
    assert all(p["duration_s"] >= 0 for p in chain if p["duration_s"] is not None)
    assert sum(res["groups_s"].values()) == pytest.approx(chain[-1]["offset_s"], abs=1e-6)
    assert phase(res, "ray_ready")["present"] and res["warnings"] == []
    assert "parallel" in st.render(res)
