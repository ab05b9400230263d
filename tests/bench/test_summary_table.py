"""bench/summary_table.py: docs/benchmarks.md's Summary table is what the script computes from the
result files the section names (so the published figures cannot drift from the raw results), and a
result without a needed phase or level is one sentence."""

from __future__ import annotations

import json
import re

import pytest

import summary_table
from helpers import REPO

DOC = REPO / "docs" / "benchmarks.md"


def section() -> str:
    m = re.search(r"^## Summary[^\n]*\n(.*?)(?=^## )", DOC.read_text(), flags=re.S | re.M)
    assert m, "docs/benchmarks.md has no Summary section"
    return m.group(1)


def test_published_summary_is_computed_from_the_named_results():
    body = section()
    sources = re.findall(r"^- `([^`]+\.json)`", body, flags=re.M)
    assert len(sources) == 2, sources
    load, ready = (json.loads((REPO / s).read_text()) for s in sources)
    expected = summary_table.table(summary_table.figures(load, ready, *sources), load, ready)
    assert expected in body
    rows = dict(re.findall(r"^\| (proxy/bare c=\d+ \w+|p99 proxy/bare c=32|ready/bare warm) \| (\d+\.\d\d) \|$", body, flags=re.M))
    assert list(rows) == ["proxy/bare c=64 equal", "proxy/bare c=64 spread", "proxy/bare c=32 equal", "p99 proxy/bare c=32", "ready/bare warm"]


def test_the_figures_before_the_fast_forward_patch_are_that_runs():
    """The Summary's sentence on the run before the fast-forward patch quotes what the script
    computes from that run's files."""
    m = re.search(r"Before the fast-forward patch \(session D,\s+`([^`]+)/`\): ([\d., ]+)\.", section())
    assert m, "the Summary no longer names the run before the fast-forward patch"
    d = REPO / m.group(1)
    names = (str(d / "serve-qwen3b-gc.json"), str(d / "serve-qwen3b-warm.json"))
    load, ready = (json.loads(open(n).read()) for n in names)
    assert [v for _, v, _ in summary_table.figures(load, ready, *names)] == m.group(2).split(", ")


def test_update_rewrites_only_the_summary(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n## Summary\n\nold\n\n## 1. Next\n\nkept\n")
    summary_table.update(doc, "| figure | value |\n")
    assert doc.read_text() == "# B\n\n## Summary\n\n| figure | value |\n\n## 1. Next\n\nkept\n"
    # a section with words before its table keeps them; the old table and its runs go
    doc.write_text("## Summary\n\nGoals: kept.\n\n| figure | value |\n|---|---|\n| a | 0.10 |\n\n- `old.json`: x\n\n## 1. Next\n")
    summary_table.update(doc, "| figure | value |\n| b | 0.20 |\n")
    assert doc.read_text() == "## Summary\n\nGoals: kept.\n\n| figure | value |\n| b | 0.20 |\n\n## 1. Next\n"


def test_missing_phase_or_level_is_one_sentence(tmp_path, capsys):
    body = section()
    load_path, ready_path = re.findall(r"^- `([^`]+\.json)`", body, flags=re.M)
    load = json.loads((REPO / load_path).read_text())
    del load["phases"]["trinity"]
    broken = tmp_path / "load.json"
    broken.write_text(json.dumps(load))
    assert summary_table.main(["--load", str(broken), "--ready", str(REPO / ready_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no 'trinity' phase; run serve_vs_bare.py with --phases bare,trinity" in err
    load = json.loads((REPO / load_path).read_text())
    load["phases"]["bare"]["load"]["levels"] = [lv for lv in load["phases"]["bare"]["load"]["levels"] if lv["concurrency"] != 64]
    with pytest.raises(summary_table.MissingFigure, match="no c=64 level in load"):
        summary_table.figures(load, json.loads((REPO / ready_path).read_text()), "x", "y")


def test_a_run_with_the_machines_steal_says_the_most_of_it():
    """A load run whose levels carry loadgen's `machine` (since session V) names the most steal of a level, for bare
    and the proxy, on its source line; the published run (older) has none and its line is unchanged."""
    body = section()
    load_path, ready_path = re.findall(r"^- `([^`]+\.json)`", body, flags=re.M)
    load = json.loads((REPO / load_path).read_text())
    ready = json.loads((REPO / ready_path).read_text())
    assert summary_table.steal_note(load) == ""
    for name, steals in (("bare", (0.02, 0.31)), ("trinity", (0.4, 0.0))):
        for level, steal in zip(load["phases"][name]["load"]["levels"], steals):
            level["machine"] = {"cpus": 16, "busy_cores": 3.0, "idle_cores": 12.0, "iowait_cores": 0.0, "steal_cores": steal}
    text = summary_table.table(summary_table.figures(load, ready, load_path, ready_path), load, ready)
    assert f"`{load['command']}`; steal, the most in a level: bare 0.31 cores, trinity 0.40 cores\n" in text
    assert text.rstrip().endswith(f"`{ready['command']}`")


def test_a_ready_run_whose_phase_compiled_the_model_is_refused_in_one_sentence(tmp_path, capsys):
    """The Summary's ready figure is a warm one: a --ready-only run whose bare or trinity phase compiled the model
    before it was ready (serve_vs_bare.py's compile-cache records) is refused, not published."""
    load_path, ready_path = re.findall(r"^- `([^`]+\.json)`", section(), flags=re.M)
    ready = json.loads((REPO / ready_path).read_text())
    trinity = ready["phases"]["trinity"]
    trinity["compile_cache_at_ready"] = {**trinity["compile_cache_before"], "files": trinity["compile_cache_before"]["files"] + 193}
    cold = tmp_path / "ready.json"
    cold.write_text(json.dumps(ready))
    assert summary_table.main(["--load", str(REPO / load_path), "--ready", str(cold)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and (
        "its trinity phase compiled the model before it was ready (193 new files in vLLM's compile cache), so its time "
        "to ready is not a warm one; rerun the --ready-only run after a run that started the model in both servers") in err
    trinity["compile_cache_at_ready"] = trinity["compile_cache_before"]  # the same files: a warm start, accepted
    rows = summary_table.figures(json.loads((REPO / load_path).read_text()), ready, "x", "y")
    assert rows[-1][0] == "ready/bare warm"
