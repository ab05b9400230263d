"""docs/benchmarks.md's, docs/gpu-results.md's and bench/README.md's session AQ claims (2026-12-07, an H100: a
forwarding hop that records nothing, bench/hop.py, in front of Trinity's engine beside the proxy) are what
bench/results/gpu-2026-12-07aq/ and docs/gpu-logs/2026-12-07aq/ hold; the tables are interleave.py's output."""

from __future__ import annotations

import json
import re

import interleave  # bench/
from helpers import REPO, doc_section, flat

RESULTS = REPO / "bench" / "results" / "gpu-2026-12-07aq"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-07aq"
RESULT = RESULTS / "interleave-hop-qwen3b.json"
HEADING = "### What of the proxy its engine's steps feel: a forwarding hop beside it (session AQ"
GPU_DOC = REPO / "docs" / "gpu-results.md"
EQUAL = ("c=32 equal", "c=64 equal")
HOPS = ("hop", "hop:wait=10", "hop:busy=2")


def data() -> dict:
    return json.loads(RESULT.read_text())


def section() -> str:
    return doc_section(HEADING)


def f1(x: float) -> str:
    return f"{x:.1f}"


def f2(x: float) -> str:
    return f"{x:.2f}"


def test_the_tables_are_interleaves_output_on_the_committed_result():
    d, text = data(), section()
    assert interleave.table(d) in text
    assert interleave.latency_table(d) in text
    assert list(d["paths"]) == ["bare", "trinity", "engine", *HOPS] and len(d["rounds"]) == 3


def test_the_hops_settings_and_counts_are_the_runs():
    d = data()
    for name, wait, busy in (("hop", 0, 0), ("hop:wait=10", 10, 0), ("hop:busy=2", 0, 2)):
        stats = d["servers"][name]["stats"]
        assert (stats["wait_ms"], stats["busy_ms"], stats["fields"]) == (wait, busy, "numeric")
        assert stats["answers"] == stats["requests"] == 9240 and stats["errors"] == 0
    pm = d["servers"]["trinity"]["proxy_metrics"]
    assert pm["rollout/model_0/total_request_count"] == pm["rollout/total_experience_count"] == 9241
    t = flat(section())
    assert "the proxy counted 9241 requests and 9241 experiences, each hop 9240 answers and no error" in t
    ready = d["servers"]
    assert f"the serve was ready after {ready['trinity']['ready']['first_answer_s']} s and bare after " \
           f"{ready['bare']['ready']['first_answer_s']} s" in t


def test_the_readings_figures_come_from_the_result():
    d = data()
    figs, lat = interleave.figures(d), interleave.latency(d)
    t = flat(section())
    out = {k: {p: lat[k][p]["outside_ms"] for p in lat[k]} for k in EQUAL}
    dec = {k: {p: lat[k][p]["decode_ms"] for p in lat[k]} for k in EQUAL}
    pooled = {k: {p: figs[k][p]["pooled"] for p in figs[k]} for k in figs}
    assert (f"({f1(out['c=32 equal']['hop:wait=10'])} against {f1(out['c=32 equal']['trinity'])} ms a request at c=32 "
            f"equal, {f1(out['c=64 equal']['hop:wait=10'])} against {f1(out['c=64 equal']['trinity'])} at c=64)") in t
    assert (f"kept {f2(pooled['c=32 equal']['hop:wait=10'])} and {f2(pooled['c=64 equal']['hop:wait=10'])} of bare (the "
            f"engine sent the same request straight: {f2(pooled['c=32 equal']['engine'])} and "
            f"{f2(pooled['c=64 equal']['engine'])}); the proxy kept {f2(pooled['c=32 equal']['trinity'])} and "
            f"{f2(pooled['c=64 equal']['trinity'])}") in t
    below = sum(r["levels"][k]["trinity"]["output_tokens_per_s"] < r["levels"][k]["hop:wait=10"]["output_tokens_per_s"]
                for r in d["rounds"] for k in EQUAL)
    assert f"below the waiting hop in {below} of the 6 equal-length rounds" in t and below == 5
    assert (f"({f1(out['c=32 equal']['hop:busy=2'])} and {f1(out['c=64 equal']['hop:busy=2'])} ms outside) kept "
            f"{f2(pooled['c=32 equal']['hop:busy=2'])} and {f2(pooled['c=64 equal']['hop:busy=2'])}") in t
    c32, c64 = dec["c=32 equal"], dec["c=64 equal"]
    assert (f"{f1(c32['trinity'])} ms through the proxy, {f1(c32['engine'])} ms sent straight, {f1(c32['hop:wait=10'])} "
            f"ms behind the waiting hop and {f1(c32['hop:busy=2'])} ms behind the busy one; at c=64 equal "
            f"{f1(c64['trinity'])}, {f1(c64['engine'])}, {f1(c64['hop:wait=10'])} and {f1(c64['hop:busy=2'])} ms") in t
    spread = [k for k in figs if "spread" in k]
    assert (f"({f2(pooled[spread[0]]['engine'])} and {f2(pooled[spread[1]]['engine'])} pooled)") in t
    hop_rounds = [x for k in spread for p in HOPS for x in figs[k][p]["rounds"]]
    assert f"moved from round to round ({f2(min(hop_rounds))}-{f2(max(hop_rounds))})" in t


def test_the_runs_facts_are_its_logs():
    t = flat(section())
    steps = (LOGS / "steps.txt").read_text()
    took = re.search(r"end interleave3b-hop rc=0 (\d+) s", steps)
    assert took and f"the step took {took.group(1)} s" in t and f"interleave3b-hop   # {took.group(1)} s" in section()
    install = (LOGS / "install.log").read_text()
    bundle = re.search(r"bundle (\w+): installed 191 wheels", install)
    assert bundle and f"Bundle `{bundle.group(1)}`" in t
    go = (LOGS / "go-printed.txt").read_text()
    assert "the installed rftstack matches /tmp/repo (its package files and 27 patches)" in go
    assert "`same_tree.py` matched (27 patches)" in t
    installed = re.search(r"install rc=\d+ (\d+) s", go)
    assert installed and f"installed in {installed.group(1)} s" in t


def test_gpu_results_and_bench_readme_say_the_same():
    gpu = GPU_DOC.read_text()
    assert "# What ran on the GPU test host (2026-11-29 to 2026-12-07, thirty-two sessions)" in gpu
    figs, lat = interleave.figures(data()), interleave.latency(data())
    row = flat(next(ln for ln in gpu.splitlines() if "(`interleave3b-hop`, three rounds; session AQ, H100)" in ln))
    assert (f"outside the engine as the proxy ({f1(lat['c=32 equal']['hop:wait=10']['outside_ms'])} / "
            f"{f1(lat['c=32 equal']['trinity']['outside_ms'])} ms at c=32) and kept "
            f"{f2(figs['c=32 equal']['hop:wait=10']['pooled'])} / {f2(figs['c=64 equal']['hop:wait=10']['pooled'])} of bare") in row
    assert f"the proxy {f2(figs['c=32 equal']['trinity']['pooled'])} / {f2(figs['c=64 equal']['trinity']['pooled'])}" in row
    assert "## Session AQ (2026-12-07, 21:52-22:12 UTC, H100)" in gpu and "Given back with 377 s left." in gpu
    readme = flat((REPO / "bench" / "README.md").read_text())
    assert "INTERLEAVE_ROUNDS=3 bash tests/gpu/host_session.sh interleave3b-hop # 898 s on an H100" in readme
    assert (f"kept {f2(figs['c=32 equal']['hop:wait=10']['pooled'])} / {f2(figs['c=64 equal']['hop:wait=10']['pooled'])} "
            f"of bare, the proxy {f2(figs['c=32 equal']['trinity']['pooled'])} / "
            f"{f2(figs['c=64 equal']['trinity']['pooled'])}") in readme
