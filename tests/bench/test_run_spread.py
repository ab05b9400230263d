"""bench/run_spread.py: docs/benchmarks.md's table of one run against the next is what the script
computes from the runs it names; the pooled ratio weighs each run by its tokens; too few runs or a run
without a level is one sentence."""

from __future__ import annotations

import copy
import json
import re

import pytest

import run_spread
from helpers import REPO
from helpers import named_runs as listed_runs

DOC = REPO / "docs" / "benchmarks.md"
HEADING = "### One run against the next"


def section() -> str:
    m = re.search(rf"^{re.escape(HEADING)}[^\n]*\n(.*?)(?=^##)", DOC.read_text(), flags=re.S | re.M)
    assert m, f"docs/benchmarks.md has no '{HEADING}' section"
    return m.group(1)


def named_runs() -> list[tuple[str, dict]]:
    runs = listed_runs(section())
    assert len(runs) >= 2, [p for p, _ in runs]
    return runs


def test_published_table_is_computed_from_the_named_runs():
    runs = named_runs()
    assert run_spread.table(runs, run_spread.spread(runs)) in section()


def test_pooled_weighs_each_run_by_its_tokens():
    (a_name, a), (b_name, b) = named_runs()[:2]
    one = run_spread.spread([(a_name, a), (b_name, b)])
    # the same run b, its bare and proxy both twice as fast: its own ratio is unchanged, its weight doubles
    fast = copy.deepcopy(b)
    for phase in ("bare", "trinity"):
        for level in fast["phases"][phase]["load"]["levels"]:
            level["output_tokens_per_s"] *= 2
    two = run_spread.spread([(a_name, a), (b_name, fast)])
    f = "proxy/bare c=32 equal"
    assert two[f]["runs"] == pytest.approx(one[f]["runs"])
    ra, rb = one[f]["runs"]
    assert ra != pytest.approx(rb)  # else the weights could not show
    # the pooled ratio moves towards run b's ratio and stays between the two
    assert abs(two[f]["pooled"] - rb) < abs(one[f]["pooled"] - rb)
    assert min(ra, rb) < two[f]["pooled"] < max(ra, rb)


def test_one_run_or_a_missing_level_is_one_sentence(tmp_path, capsys):
    (path, run), *_ = named_runs()
    assert run_spread.main([str(REPO / path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "give two runs or more" in err
    broken = copy.deepcopy(run)
    broken["phases"]["bare"]["load_spread"]["levels"] = [
        lv for lv in broken["phases"]["bare"]["load_spread"]["levels"] if lv["concurrency"] != 32
    ]
    bad = tmp_path / "broken.json"
    bad.write_text(json.dumps(broken))
    assert run_spread.main([str(REPO / path), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no c=32 level in load_spread" in err


def test_json_output_names_the_runs(capsys):
    runs = named_runs()
    assert run_spread.main(["--json", *(str(REPO / p) for p, _ in runs)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == len(runs)
    assert out["figures"]["p99 proxy/bare c=32"]["pooled"] is None
    assert len(out["figures"]["proxy/bare c=64 equal"]["runs"]) == len(runs)


RECORD_RUNS = "bench/results/gpu-2026-12-04u"
EACH = [f"{RECORD_RUNS}/serve-qwen3b-record1.json:trinity", f"{RECORD_RUNS}/serve-qwen3b-record1.json:trinity-record",
        f"{RECORD_RUNS}/serve-qwen3b-record2.json:trinity-record", f"{RECORD_RUNS}/serve-qwen3b-record-one.json:trinity-record1"]


def test_the_recording_processes_serve_table_is_what_each_computes(capsys):
    """docs/benchmarks.md's serve-mode table of the recording processes (session U): one column per run and phase,
    each against its own run's bare; the run without spread levels shows "-" there."""
    import os

    cwd = os.getcwd()
    os.chdir(REPO)  # the table names the files as given, relative to the repository
    try:
        assert run_spread.main(["--each", *EACH]) == 0
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "| proxy/bare c=64 spread | 0.75 | 0.60 | 0.67 | - |" in out
    assert out in DOC.read_text(), "docs/benchmarks.md should hold:\n" + out


def test_each_without_a_phase_or_with_an_unknown_one_is_one_sentence(capsys):
    assert run_spread.main(["--each", str(REPO / RECORD_RUNS / "serve-qwen3b-record1.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not RUN.json:PHASE; name the phase after a colon" in err
    assert run_spread.main(["--each", f"{REPO / RECORD_RUNS / 'serve-qwen3b-record2.json'}:trinity"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has no 'trinity' phase" in err


def test_a_label_two_runs_carry_is_told_apart_by_its_folder():
    """Two sessions' `proxy3b-abba` runs carry the same labels: their columns name the results folder."""
    runs = [(f"bench/results/gpu-{d}/serve-qwen3b-abba1.json", {"label": "qwen3b-abba1"}) for d in ("2026-12-03q", "2026-12-04w")]
    runs.append(("bench/results/gpu-2026-12-03p/serve-qwen3b-long.json", {"label": "qwen3b-long"}))
    assert run_spread.column_names(runs) == ["qwen3b-abba1 (2026-12-03q)", "qwen3b-abba1 (2026-12-04w)", "qwen3b-long"]
