"""docs/benchmarks.md's session AF claims (2026-12-06, H100) are what bench/results/gpu-2026-12-06af/ holds: the
Summary's long run twice with the anyio patch on (host_session.sh proxy3b-abba), the warm time to ready
(ready-3b-exec), and a third order started outside host_session.sh, kept out of the figures; docs/gpu-results.md and
docs/serve.md say the same."""

from __future__ import annotations

import json

import pytest

import run_spread
import summary_table
from helpers import REPO
from helpers import doc_section
from helpers import named_runs

R = REPO / "bench" / "results" / "gpu-2026-12-06af"
ABBA1, ABBA2, ABBA3 = (R / f"serve-qwen3b-abba{i}.json" for i in (1, 2, 3))
READY = R / "serve-qwen3b-warm-exec.json"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-06af"
HEADING = "### The long run with the anyio patch on, and warm ready (session AF"
HARNESS_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_CACHE_ROOT": "/tmp/vllm-cache"}


def text() -> str:
    return " ".join(doc_section(HEADING).split())


def load(path) -> dict:
    return json.loads(path.read_text())


def rel(path) -> str:
    return path.relative_to(REPO).as_posix()


def tok_s(result: dict, phase: str, c: int, key: str = "load") -> float:
    return run_spread._tok_s(result, phase, key, c, "doc")


def models_s(phase: str) -> float:
    return load(READY)["phases"][phase]["ready"]["models_s"]


def test_the_runs_are_the_steps_the_section_names():
    steps = (LOGS / "steps.txt").read_text()
    assert "end proxy3b-abba rc=0 519 s" in steps and "end ready-3b-exec rc=0 227 s" in steps
    assert "bash tests/gpu/host_session.sh proxy3b-abba ready-3b-exec" in doc_section(HEADING)
    assert "519 s and 227 s" in doc_section(HEADING)
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        proxy3b-abba) ", 1)[1].split(";;", 1)[0]
    assert "1:bare,trinity 2:trinity,bare" in step
    for order, path in (("bare,trinity", ABBA1), ("trinity,bare", ABBA2)):
        r = load(path)
        assert f"--phases {order} " in r["command"] and "--rounds 32" in r["command"]
        assert list(r["phases"]) == order.split(",")
        assert r["machine"]["gpu"].startswith("NVIDIA H100")
    # the bundle the section names is the one installed, and it was the tree's
    assert "bundle b5332822b0d5: installed 191 wheels" in (LOGS / "install.log").read_text()
    assert "`b5332822b0d5`" in doc_section(HEADING)
    assert "the installed rftstack matches /tmp/repo (its package files and 26 patches)" in (LOGS / "go.txt").read_text()
    # the patch was on: applied on the host, and no run switched it off
    assert "trinity-engine-anyio-root.patch: trinity/common/models/vllm_patch/api_patch_v17.py: already applied" in (
        LOGS / "patches.log").read_text()
    for path in (ABBA1, ABBA2, READY):
        assert "RFTSTACK_ENGINE_ANYIO_ROOT" not in json.dumps(load(path))


def test_the_table_is_run_spread_of_the_two_named_runs():
    sec = doc_section(HEADING)
    runs = named_runs(sec)
    assert [p for p, _ in runs] == [rel(ABBA1), rel(ABBA2)]
    assert run_spread.table(runs, run_spread.spread(runs)) in sec


def test_the_reading_of_c64_equal_is_bares_swing():
    a, b = load(ABBA1), load(ABBA2)
    t = text()
    assert (f"bare served {tok_s(a, 'bare', 64):.0f} output tokens/s in the first run and {tok_s(b, 'bare', 64):.0f} "
            f"in the second, the proxy {tok_s(a, 'trinity', 64):.0f} and {tok_s(b, 'trinity', 64):.0f}") in t
    # the proxy moved by less than bare did
    assert abs(tok_s(a, "trinity", 64) - tok_s(b, "trinity", 64)) < abs(tok_s(a, "bare", 64) - tok_s(b, "bare", 64)) / 5
    s = run_spread.spread([("a", a), ("b", b)])
    assert f"Pooled over the two, {s['proxy/bare c=64 equal']['pooled']:.2f} at c=64 equal" in t
    assert f"{s['proxy/bare c=64 spread']['pooled']:.2f} with spread lengths and {s['proxy/bare c=32 equal']['pooled']:.2f} at c=32 equal" in t
    c32 = [f"{r:.2f}" for r in s["proxy/bare c=32 equal"]["runs"]]
    assert f"the figure ({c32[0]} / {c32[1]})" in t
    p99 = [f"{summary_table.p99_ratio(r, 'doc'):.2f}" for r in (a, b)]
    assert f"p99 at c=32 {p99[0]} and {p99[1]} against the limit of 1.25" in t


def test_the_h200_runs_the_reading_names():
    """'the H200 runs of sessions P and Q put it (0.84-0.93)' and 'the five runs without it pooled 0.86': the files of
    section 1's "One run against the next"."""
    runs = named_runs(doc_section("### One run against the next"))
    assert len(runs) == 5 and all("H200" in r["machine"]["gpu"] for _, r in runs)
    s = run_spread.spread(runs)
    pq = [r for (p, _), r in zip(runs, s["proxy/bare c=32 equal"]["runs"]) if "-03p/" in p or "-03q/" in p]
    t = text()
    assert f"sessions P and Q put it ({min(pq):.2f}-{max(pq):.2f})" in t
    assert s["proxy/bare c=64 equal"]["pooled"] == pytest.approx(0.86, abs=0.005)
    assert s["proxy/bare c=32 equal"]["pooled"] == pytest.approx(0.86, abs=0.005)
    assert "the five runs without it pooled 0.86 at c=64 and at c=32 equal" in t


def test_the_ready_figures():
    t = text()
    bare, serve, uni, mp = (models_s(p) for p in ("bare", "trinity", "trinity-uni", "trinity-mp"))
    # what summary_table.py would put in the Summary's ready row from these files
    rows = {f: v for f, v, _ in summary_table.figures([load(ABBA1)], load(READY), ["abba1"], "ready")}
    assert rows["ready/bare warm"] == f"{serve / bare:.2f}"
    assert (f"bare {bare} s, `rftstack serve` {serve} s (**{rows['ready/bare warm']}x**), with vLLM's uni executor "
            f"{uni} s ({uni / bare:.2f}x), `mp` spawned {mp} s ({mp / bare:.2f}x)") in t
    assert f"warm ready {rows['ready/bare warm']} against 1.5" in t
    assert float(rows["ready/bare warm"]) <= 1.5


def test_the_third_run_ran_without_the_harness_environment():
    for path in (ABBA1, ABBA2, READY):
        env = load(path)["settings"]["env"]
        assert {k: env[k] for k in HARNESS_ENV} == HARNESS_ENV
    c = load(ABBA3)
    assert all(c["settings"]["env"][k] is None for k in HARNESS_ENV)
    assert "host_session.sh" not in c["command"] and "--label qwen3b-abba3 --phases bare,trinity" in c["command"]
    t = text()
    # kept out of the table and the pooled figures
    assert rel(ABBA3) not in [p for p, _ in named_runs(doc_section(HEADING))]
    b2 = load(ABBA2)
    first = {n: c["phases"][n]["ready"]["first_answer_s"] for n in ("bare", "trinity")}
    first2 = {n: b2["phases"][n]["ready"]["first_answer_s"] for n in ("bare", "trinity")}
    assert (f"ready {first['bare']} s bare, {first['trinity']} s trinity; {first2['bare']} and {first2['trinity']} s "
            f"in `qwen3b-abba2`") in t
    s = run_spread.spread([("c", c), ("b", b2)])
    c32, c64 = s["proxy/bare c=32 equal"]["runs"][0], s["proxy/bare c=64 equal"]["runs"][0]
    assert f"the proxy served {c32:.2f} of bare at c=32 equal and {c64:.2f} at c=64, p99 " \
           f"{summary_table.p99_ratio(c, 'doc'):.2f}" in t
    # both servers compiled again: the compile cache was not the harness's
    assert first["bare"] > 2 * first2["bare"]
    # "bare's spread levels also fell": below both comparable runs at both levels
    assert "(bare's spread levels also fell)" in t
    for level in (32, 64):
        assert tok_s(c, "bare", level, "load_spread") < min(tok_s(r, "bare", level, "load_spread") for r in (load(ABBA1), b2))


def test_gpu_results_and_serve_say_the_same():
    a, b = load(ABBA1), load(ABBA2)
    s = run_spread.spread([("a", a), ("b", b)])
    runs = {f: [f"{r:.2f}" for r in s[f]["runs"]] for f in s if f != run_spread.P99}
    gr = " ".join((REPO / "docs" / "gpu-results.md").read_text().split())
    row = gr.split("| the Summary's long run with the anyio patch on", 1)[1].split("\n", 1)[0]
    e64, sp64, e32 = runs["proxy/bare c=64 equal"], runs["proxy/bare c=64 spread"], runs["proxy/bare c=32 equal"]
    assert f"{e64[0]} / {e64[1]} at c=64 equal (pooled {s['proxy/bare c=64 equal']['pooled']:.2f}" in row
    assert f"{sp64[0]} / {sp64[1]} spread, {e32[0]} / {e32[1]} at c=32 equal (pooled " \
           f"{s['proxy/bare c=32 equal']['pooled']:.2f})" in row
    bare, serve = models_s("bare"), models_s("trinity")
    assert f"warm ready **{serve / bare:.2f}x** ({serve} s against {bare} s)" in row
    af1 = gr.split("### AF1. The long run with the anyio patch on", 1)[1].split("## Session AE", 1)[0]
    assert f"{e64[0]} and {e64[1]} at c=64 equal, pooled {s['proxy/bare c=64 equal']['pooled']:.2f}" in af1
    serve_md = " ".join((REPO / "docs" / "serve.md").read_text().split())
    assert (f"session AF's long run with it on, two runs on an H100: the proxy {s['proxy/bare c=64 equal']['pooled']:.2f} "
            f"of bare pooled at c=64 equal, {s['proxy/bare c=32 equal']['pooled']:.2f} at c=32 equal") in serve_md
    bm = " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    assert (f"Session AF ran it with the patch on (above): pooled over two runs {s['proxy/bare c=64 equal']['pooled']:.2f} "
            f"of bare at c=64 equal and {s['proxy/bare c=32 equal']['pooled']:.2f} at c=32 equal, on an H100") in bm
    # the Summary itself is still session P's: not these files
    summary = bm.split("## Summary", 1)[1].split("## 1.", 1)[0]
    assert "gpu-2026-12-06af" not in summary
