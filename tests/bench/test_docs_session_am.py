"""docs/benchmarks.md's, docs/gpu-results.md's and bench/README.md's session AM claims (2026-12-07, H100: spread lengths
sent straight to Trinity's engine, the long run in both orders on one machine, the builders' switch warm twice, and
the proxy before a TEST DOUBLE that answers spread lengths at spread times on the CPU machine) are what
bench/results/gpu-2026-12-07am/, bench/results/cpu-2026-12-07am/ and docs/gpu-logs/2026-12-07am/ hold."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
import run_spread  # bench/
from summary_table import p99_ratio  # bench/
from helpers import REPO
from helpers import answered_level as level
from helpers import answered_tok_s as tok
from helpers import doc_section, flat

RESULTS = REPO / "bench" / "results" / "gpu-2026-12-07am"
CPU = REPO / "bench" / "results" / "cpu-2026-12-07am"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-07am"
BENCH_HEADING = "### Spread lengths: Trinity's engine directly, and both orders on one machine (session AM"
BENCH_DOC = REPO / "docs" / "benchmarks.md"
GPU_DOC = REPO / "docs" / "gpu-results.md"
LEVELS = (("c=32 equal (1024)", "load", 32), ("c=64 equal (2048)", "load", 64), ("c=32 spread (1024)", "load_spread", 32),
          ("c=64 spread (2048)", "load_spread", 64))  # fmt: skip
SPREAD = "load_spread"
DIRECT = "load_engine_direct_spread"


def bench_text() -> str:
    return flat(doc_section(BENCH_HEADING))


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def runs() -> tuple[dict, dict]:
    return result("serve-qwen3b-spread-direct.json"), result("serve-qwen3b-abba2.json")


def pct(x: float) -> str:
    return f"{round(x * 100)} %"


def cell(lv: dict, bare: dict | None) -> str:
    ratio = f" ({lv['output_tokens_per_s'] / bare['output_tokens_per_s']:.2f})" if bare else ""
    return f"{lv['output_tokens_per_s']:.0f}{ratio}, {lv['latency_s']['p50']:.3f} / {lv['latency_s']['p99']:.3f}"


def test_the_table_is_the_two_runs():
    one, two = runs()
    assert list(one["phases"]) == ["bare", "trinity"] and list(two["phases"]) == ["trinity", "bare"]
    assert one["settings"]["env"]["RFTSTACK_PROXY_BUILD_PROCESSES"] is None  # today's defaults
    assert "--engine-direct-spread" in one["command"] and "--engine-direct-spread" not in two["command"]
    table = doc_section(BENCH_HEADING)
    for name, key, c in LEVELS:
        b1, b2 = level(one, "bare", key, c), level(two, "bare", key, c)
        direct = cell(level(one, "trinity", DIRECT, c), b1) if key == SPREAD else "-"
        row = (f"| {name} | {cell(b1, None)} | {cell(level(one, 'trinity', key, c), b1)} | {direct} | "
               f"{cell(level(two, 'trinity', key, c), b2)} | {cell(b2, None)} |")
        assert row in table, row


def test_the_engine_did_not_lose_with_spread_lengths():
    one, _ = runs()
    t = bench_text()
    engine = [tok(one, "trinity", DIRECT, c) / tok(one, "bare", SPREAD, c) for c in (32, 64)]
    proxy = [tok(one, "trinity", SPREAD, c) / tok(one, "bare", SPREAD, c) for c in (32, 64)]
    of_engine = [tok(one, "trinity", SPREAD, c) / tok(one, "trinity", DIRECT, c) for c in (32, 64)]
    assert min(engine) >= 1.0  # "did not lose against bare"
    assert f"it served {engine[0]:.2f} / {engine[1]:.2f} of bare's spread levels (c=32 / c=64), the proxy " \
           f"{proxy[0]:.2f} / {proxy[1]:.2f}; the proxy was {of_engine[0]:.2f} / {of_engine[1]:.2f} of its own engine" in t
    assert of_engine[1] < 1 and f"between the proxy and its engine, {pct(1 - of_engine[1])}, not in the engine" in t
    s = one["summary"]["throughput_ratio_spread"]
    assert round(s["64"]["engine_direct_vs_bare"], 2) == round(engine[1], 2)  # serve_vs_bare's own summary agrees
    for text in (flat(doc_section("### AM1.", GPU_DOC)), flat((REPO / "bench" / "README.md").read_text())):
        assert f"{engine[0]:.2f} / {engine[1]:.2f} of bare" in text
        assert f"the proxy {proxy[0]:.2f} / {proxy[1]:.2f} of bare and {of_engine[0]:.2f} / {of_engine[1]:.2f} of its engine" in text


def test_bare_moved_more_than_the_proxy():
    one, two = runs()
    t = bench_text()

    def lost(run: dict, phase: str, c: int) -> float:
        return 1 - tok(run, phase, SPREAD, c) / tok(run, phase, "load", c)

    assert (f"Bare's spread levels were {pct(lost(one, 'bare', 32))} / {pct(lost(one, 'bare', 64))} below its own equal "
            f"levels in run 1") in t
    b1, b2 = level(one, "bare", "load", 32), level(one, "bare", SPREAD, 32)
    assert f"(median {b2['latency_s']['p50']:.3f} s against {b1['latency_s']['p50']:.3f} s at c=32)" in t
    assert f"and {pct(lost(two, 'bare', 32))} / {pct(lost(two, 'bare', 64))} in run 2" in t
    assert (f"the proxy lost {pct(lost(one, 'trinity', 32))} / {pct(lost(one, 'trinity', 64))} in run 1 and "
            f"{pct(lost(two, 'trinity', 32))} / {pct(lost(two, 'trinity', 64))} in run 2") in t
    assert f"The same bare served {tok(one, 'bare', SPREAD, 32):.0f} and then {tok(two, 'bare', SPREAD, 32):.0f} tokens/s" in t
    longest = max(lv["latency_s"]["max"] for run in (one, two) for ph in run["phases"].values()
                  for key in ("load", SPREAD, DIRECT) if key in ph for lv in ph[key]["levels"])
    assert longest < 1.5 and f"no level had a stall (the longest answer {longest:.2f} s)" in t
    # "each first serve also added 17 files to vLLM's compile cache after its ready"
    after = [one["phases"]["trinity"]["compile_cache_before"]["files"] - one["phases"]["bare"]["compile_cache_at_ready"]["files"],
             two["phases"]["trinity"]["compile_cache_before"]["files"] - one["phases"]["trinity"]["compile_cache_at_ready"]["files"]]
    assert after[0] == after[1] and f"added {after[0]} files to vLLM's compile cache after its ready" in t
    assert one["summary"]["compiled_before_ready"]["bare"] > 0 and one["summary"]["compiled_before_ready"]["trinity"] > 0
    assert not two["summary"].get("compiled_before_ready")
    grew = [tok(two, "bare", SPREAD, c) / tok(one, "bare", SPREAD, c) - 1 for c in (64, 32)]
    preface = flat(BENCH_DOC.read_text().split("## 1. Serving")[0])
    assert f"bare's own spread levels moved by {round(grew[0] * 100)}-{round(grew[1] * 100)} % from the first run" in preface
    am1 = flat(doc_section("### AM1.", GPU_DOC))
    assert (f"{pct(lost(one, 'bare', 64))[:-2]}-{pct(lost(one, 'bare', 32))} below its equal ones here and "
            f"{pct(lost(two, 'bare', 32))[:-2]}-{pct(lost(two, 'bare', 64))} in run 2") in am1


def test_run_two_the_cold_ready_and_the_pooled_figures():
    one, two = runs()
    t = bench_text()
    r = {(k, c): tok(two, "trinity", k, c) / tok(two, "bare", k, c) for _, k, c in LEVELS}
    p99 = p99_ratio(two, "run 2")
    ready = {ph: v["ready"]["first_answer_s"] for ph, v in two["phases"].items()}
    figures = (f"{r['load', 32]:.2f} (c=32 equal), {r['load', 64]:.2f} (c=64 equal), {r[SPREAD, 32]:.2f} / "
               f"{r[SPREAD, 64]:.2f} (spread), p99 at c=32 {p99:.2f} of bare, warm ready **{ready['trinity'] / ready['bare']:.2f}x** "
               f"({ready['trinity']:.2f} s against {ready['bare']:.2f} s)")
    assert figures in t
    assert f"{r['load', 32]:.2f} / {r['load', 64]:.2f} of bare (c=32 / c=64 equal), {r[SPREAD, 32]:.2f} / " \
           f"{r[SPREAD, 64]:.2f} spread, p99 {p99:.2f} at c=32, warm ready **{ready['trinity'] / ready['bare']:.2f}x**" \
           in flat(GPU_DOC.read_text())
    preface = flat(BENCH_DOC.read_text().split("## 1. Serving")[0])
    assert (f"the second run read {r['load', 32]:.2f} (c=32 equal), {r['load', 64]:.2f} (c=64 equal), {r[SPREAD, 32]:.2f} / "
            f"{r[SPREAD, 64]:.2f} (spread), p99 {p99:.2f}, warm ready {ready['trinity'] / ready['bare']:.2f}") in preface
    one_r = [tok(one, "trinity", "load", c) / tok(one, "bare", "load", c) for c in (32, 64)]
    one_p99 = p99_ratio(one, "run 1")
    cold = {ph: v["ready"]["first_answer_s"] for ph, v in one["phases"].items()}
    assert (f"Run 1: {one_r[0]:.2f} / {one_r[1]:.2f} (equal), p99 at c=32 {one_p99:.2f}; its ready was cold (both "
            f"compiled): {cold['trinity']:.2f} s against {cold['bare']:.2f} s, {cold['trinity'] / cold['bare']:.2f}x") in t
    figures_ = run_spread.spread([("run 1", one), ("run 2", two)])
    pooled = {(k, c): figures_[f"proxy/bare c={c} {'spread' if k == SPREAD else 'equal'}"]["pooled"] for _, k, c in LEVELS}
    assert (f"{pooled['load', 64]:.2f} (c=64 equal), {pooled[SPREAD, 64]:.2f} (c=64 spread), {pooled['load', 32]:.2f} "
            f"(c=32 equal), {pooled[SPREAD, 32]:.2f} (c=32 spread)") in t
    assert (f"pooled with run 1, {pooled['load', 32]:.2f} / {pooled['load', 64]:.2f} (equal), {pooled[SPREAD, 32]:.2f} / "
            f"{pooled[SPREAD, 64]:.2f} (spread)") in flat(doc_section("### AM2.", GPU_DOC))
    for run in (one, two):
        m = run["phases"]["trinity"]["proxy_metrics"]
        assert m["rollout/model_0/total_request_count"] == m["rollout/total_experience_count"]
        assert f"({m['rollout/model_0/total_request_count']} requests, {m['rollout/total_experience_count']} experiences)" in t


def test_run_spread_pools_as_the_text_says(capsys):
    """bench/run_spread.py, the section's command, prints the pooled column the text quotes."""
    assert run_spread.main([str(RESULTS / "serve-qwen3b-spread-direct.json"), str(RESULTS / "serve-qwen3b-abba2.json")]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (proxy/bare [^|]+?) \|.* \| ([\d.]+) \|$", out, re.M)}
    t = bench_text()
    assert f"{rows['proxy/bare c=64 equal']} (c=64 equal), {rows['proxy/bare c=64 spread']} (c=64 spread)" in t


def test_the_builders_switch_warm_twice():
    late = [result("serve-qwen3b-warm-late1.json"), result("serve-qwen3b-warm-late2.json")]
    s = [{ph: v["ready"]["first_answer_s"] for ph, v in run["phases"].items()} for run in late]
    for run in late:
        assert run["phases"]["trinity-late"]["env"] == {"RFTSTACK_PROXY_BUILDERS_EARLY": "0"}
        assert not run["summary"].get("compiled_before_ready")  # warm, unlike session AL's
    t = bench_text()
    assert (f"bare {s[0]['bare']:.2f} / {s[1]['bare']:.2f} s, `trinity` (builders started with the Explorer) "
            f"{s[0]['trinity']:.2f} / {s[1]['trinity']:.2f} s ({s[0]['trinity'] / s[0]['bare']:.2f}x / "
            f"{s[1]['trinity'] / s[1]['bare']:.2f}x), `trinity-late` {s[0]['trinity-late']:.2f} / {s[1]['trinity-late']:.2f} s "
            f"({s[0]['trinity-late'] / s[0]['bare']:.2f}x / {s[1]['trinity-late'] / s[1]['bare']:.2f}x)") in t
    d = [x["trinity"] - x["trinity-late"] for x in s]
    assert d[0] < 0 < d[1]  # one faster, one slower: "no effect that two starts can tell"
    assert f"gave {-d[0]:.2f} s less and {d[1]:.2f} s more than starting them with the app" in t
    assert f"the builders started with the Explorer {-d[0]:.2f} s faster and {d[1]:.2f} s slower" in flat(GPU_DOC.read_text())
    readme = flat((REPO / "bench" / "README.md").read_text())
    assert f"the early start {-d[0]:.2f} s faster, then {d[1]:.2f} s slower than the late one" in readme


def serve_times(path) -> dict[str, tuple[datetime, datetime]]:
    """Per serve log in a serve-lines file: (the last builder ready, All models are ready.)."""
    out: dict[str, list] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^(\S+/(trinity(?:-late)?)-run/logs/trinity\.log):.*INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[\S+\] (.*)$", line)
        if not m:
            continue
        at = datetime.strptime(m.group(3), "%m-%d %H:%M:%S")
        times = out.setdefault(m.group(1), [None, None])
        if re.match(r"Experience builder \d+ ready", m.group(4)):
            times[0] = max(times[0] or at, at)
        elif m.group(4).startswith("All models are ready."):
            times[1] = at
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_where_the_builders_start():
    early, late = [], []
    for name in ("proxy3b-spread-direct", "proxy3b-abba", "ready-3b-late1", "ready-3b-late2"):
        for log, (builders, models) in serve_times(LOGS / f"{name}-serve-lines.txt").items():
            (late if "/trinity-late-run/" in log else early).append((models - builders).total_seconds())
    assert len(early) == 4 and len(late) == 2 and min(early) > 0 > max(late)
    t = bench_text()
    assert f"the last of the four builders was ready {min(early):.0f} to {max(early):.0f} s before `All models are ready.`" in t
    assert f"with it off, {-max(late):.0f} to {-min(late):.0f} s after" in t
    assert f"ready {min(early):.0f} to {max(early):.0f} s before" in flat(doc_section("### AM2.", GPU_DOC))
    assert f"the builders ready {min(early):.0f}-{max(early):.0f} s before the engine" in flat((REPO / "bench" / "README.md").read_text())


def cpu_run(spread: str) -> dict:
    return json.loads((CPU / f"proxy-overhead-per-token-{spread}.json").read_text())


def cpu_against_direct(run: dict, variant: str, c: int) -> tuple[float, float]:
    """A proxy_overhead variant's level at ``c`` against the double reached directly in the same run: (tokens/s ratio,
    mean answer's extra seconds)."""
    lv, direct = ({x["concurrency"]: x for x in run["runs"][name]["levels"]}[c] for name in (variant, "direct"))
    return (lv["output_tokens_per_s"] / direct["output_tokens_per_s"],
            lv["latency_s"]["mean"] - direct["latency_s"]["mean"])  # fmt: skip


@pytest.mark.parametrize("spread,key", [("equal", "load"), ("spread", SPREAD)])
def test_the_cpu_double_at_spread_times(spread, key):
    run = cpu_run(spread)
    assert run["upstream_delay_s"] == 0.1 and run["upstream_delay_per_token_s"] == 0.004
    assert run["max_tokens_spread"] == (0.75 if spread == "spread" else 0.0) and run["machine"]["cpus"] == 2
    table = doc_section(BENCH_HEADING)
    names = {"hop-gc+numeric": "forwarding only (hop-gc)", "sqlite-gc+numeric": "recording on the proxy's loop (sqlite-gc)",
             "sqlite-build+numeric": "recording, one builder process (sqlite-build)"}
    for variant, name in names.items():
        row = next(ln for ln in table.splitlines() if ln.startswith(f"| {name} |")).split(" | ")
        cells = row[1:3] if key == "load" else [row[3], row[4].rstrip(" |")]
        for c, text in zip((32, 64), cells):
            ratio, more = cpu_against_direct(run, variant, c)
            assert text == f"{ratio:.3f}, +{more * 1000:.1f} ms", (variant, c, text)


def test_recording_costs_less_at_spread_times():
    equal, spread = cpu_run("equal"), cpu_run("spread")
    for variant in ("sqlite-gc+numeric", "sqlite-build+numeric"):
        for c in (32, 64):  # "with spread lengths less"
            assert cpu_against_direct(spread, variant, c)[0] > cpu_against_direct(equal, variant, c)[0]


def test_the_steps_and_the_install():
    steps = (LOGS / "steps.txt").read_text()
    for line in ("end proxy3b-spread-direct rc=0 320 s", "end proxy3b-abba rc=0 188 s", "end ready-3b-late rc=0 132 s",
                 "all done", "SigIgn:\t0000000001001000", "doctor: ok"):
        assert line in steps, line
    assert "end ready-3b-late rc=0 130 s" in (LOGS / "steps-ready2.txt").read_text()
    assert "bundle d22ae0668627: installed 191 wheels" in (LOGS / "install.log").read_text()
    assert "191 files, 696.6 MiB in 19 parts" in (LOGS / "install.log").read_text()
    printed = (LOGS / "go-printed.txt").read_text()
    assert "install rc=3 54 s" in printed and "(its package files and 27 patches)" in printed
    head = flat(GPU_DOC.read_text().split("### AM1.")[0].split("## Session AM (")[1])
    for claim in ("bundle `d22ae0668627`, 191 files in 19 parts", "installed in 54 s", "`same_tree.py` matched (27 patches)",
                  "`proxy3b-spread-direct` 320 s, `proxy3b-abba` 188 s, `ready-3b-late` 132 s", "`ready-3b-late` once more (130 s",
                  'ABBA_ORDERS="2:trinity,bare"'):
        assert claim in head, claim
    assert "bundle `d22ae0668627` built from commit 261684e's tree" in bench_text()
