"""bench/summary_table.py: docs/benchmarks.md's Summary table is what the script computes from the
result files the section names (so the published figures cannot drift from the raw results), and a
result without a needed phase or level is one sentence."""

from __future__ import annotations

import json
import re

import pytest

import summary_table
import helpers
from helpers import REPO

DOC = REPO / "docs" / "benchmarks.md"
# session P's files (the Summary 2026-12-03 to session AP): one load run without loadgen's steal, one warm ready run
P_LOAD = "bench/results/gpu-2026-12-03p/serve-qwen3b-long.json"
P_READY = "bench/results/gpu-2026-12-03p/serve-qwen3b-warm-exec.json"
# session AP's long run in both orders (host step proxy3b-abba)
AP = "bench/results/gpu-2026-12-07ap"
AP_LOADS = [f"{AP}/serve-qwen3b-abba1.json", f"{AP}/serve-qwen3b-abba2.json"]


def read(path: str) -> dict:
    return json.loads((REPO / path).read_text())


def section() -> str:
    m = re.search(r"^## Summary[^\n]*\n(.*?)(?=^## )", DOC.read_text(), flags=re.S | re.M)
    assert m, "docs/benchmarks.md has no Summary section"
    return m.group(1)


def test_published_summary_is_computed_from_the_named_results():
    body = section()
    sources = re.findall(r"^- `([^`]+\.json)`", body, flags=re.M)
    assert len(sources) >= 2, sources
    *load_names, ready_name = sources
    loads, ready = [read(s) for s in load_names], read(ready_name)
    expected = summary_table.table(summary_table.figures(loads, ready, load_names, ready_name), loads, load_names, ready,
                                   ready_name)
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
    assert [v for _, v, _ in summary_table.figures([load], ready, names[:1], names[1])] == m.group(2).split(", ")


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
    load_path, ready_path = P_LOAD, P_READY
    load = read(load_path)
    del load["phases"]["trinity"]
    broken = tmp_path / "load.json"
    broken.write_text(json.dumps(load))
    assert summary_table.main(["--load", str(broken), "--ready", str(REPO / ready_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no 'trinity' phase; run serve_vs_bare.py with --phases bare,trinity" in err
    load = json.loads((REPO / load_path).read_text())
    load["phases"]["bare"]["load"]["levels"] = [lv for lv in load["phases"]["bare"]["load"]["levels"] if lv["concurrency"] != 64]
    with pytest.raises(summary_table.MissingFigure, match="no c=64 level in load"):
        summary_table.figures([load], read(ready_path), ["x"], "y")


def test_a_run_with_the_machines_steal_says_the_most_of_it():
    """A load run whose levels carry loadgen's `machine` (since session V) names the most steal of a level, for bare
    and the proxy, on its source line; session P's run (older) has none and its line is unchanged."""
    load_path, ready_path = P_LOAD, P_READY
    load, ready = read(load_path), read(ready_path)
    assert summary_table.steal_note(load) == ""
    for name, steals in (("bare", (0.02, 0.31)), ("trinity", (0.4, 0.0))):
        for level, steal in zip(load["phases"][name]["load"]["levels"], steals):
            level["machine"] = {"cpus": 16, "busy_cores": 3.0, "idle_cores": 12.0, "iowait_cores": 0.0, "steal_cores": steal}
    text = summary_table.table(summary_table.figures([load], ready, [load_path], ready_path), [load], [load_path], ready,
                               ready_path)
    assert f"`{load['command']}`; steal, the most in a level: bare 0.31 cores, trinity 0.40 cores\n" in text
    assert text.rstrip().endswith(f"`{ready['command']}`")


def test_a_ready_run_whose_phase_compiled_the_model_is_refused_in_one_sentence(tmp_path, capsys):
    """The Summary's ready figure is a warm one: a --ready-only run whose bare or trinity phase compiled the model
    before it was ready (serve_vs_bare.py's compile-cache records) is refused, not published."""
    load_path, ready_path = P_LOAD, P_READY
    ready = read(ready_path)
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
    rows = summary_table.figures([read(load_path)], ready, ["x"], "y")
    assert rows[-1][0] == "ready/bare warm"


def test_several_load_runs_pool_throughput_and_take_the_highest_p99(capsys):
    """Two long runs (both orders): each throughput row is the proxy's tokens/s summed over the runs against bare's,
    the p99 row the higher run's, a line gives each run's values, and each run gets its source line."""
    loads = [read(p) for p in AP_LOADS]
    ready = read(f"{AP}/serve-qwen3b-warm.json")
    rows = {f: v for f, v, _ in summary_table.figures(loads, ready, AP_LOADS, "r")}
    singles = [summary_table.figures([r], ready, [n], "r") for r, n in zip(loads, AP_LOADS)]
    for figure, key, c in summary_table.THROUGHPUT:
        proxy = sum(helpers.answered_level(r, "trinity", key, c)["output_tokens_per_s"] for r in loads)
        bare = sum(helpers.answered_level(r, "bare", key, c)["output_tokens_per_s"] for r in loads)
        assert rows[figure] == f"{proxy / bare:.2f}"
        values = sorted(float(dict((f, v) for f, v, _ in one)[figure]) for one in singles)
        assert values[0] - 0.01 <= float(rows[figure]) <= values[1] + 0.01  # pooled lies between the runs
    p99s = [summary_table.p99_ratio(r, n) for r, n in zip(loads, AP_LOADS)]
    assert rows[summary_table.P99] == f"{max(p99s):.2f}" and min(p99s) < max(p99s)
    assert summary_table.main(["--load", AP_LOADS[0], "--load", AP_LOADS[1], "--ready", f"{AP}/serve-qwen3b-warm.json"]) == 0
    out = capsys.readouterr().out
    assert "Pooled over 2 load runs" in out and f"p99 proxy/bare c=32 {p99s[0]:.2f}, {p99s[1]:.2f}." in out
    assert [line.split("`")[1] for line in out.splitlines() if line.startswith("- `")] == [*AP_LOADS, f"{AP}/serve-qwen3b-warm.json"]


def test_one_load_run_prints_no_pooled_line(capsys):
    assert summary_table.main(["--load", P_LOAD, "--ready", P_READY]) == 0
    out = capsys.readouterr().out
    assert "Pooled" not in out and out.count("\n- `") == 2
