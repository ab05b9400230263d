"""docs/benchmarks.md's and docs/gpu-results.md's session AL claims (2026-12-07, H100: the builders started with the
Explorer, the long run in one order, time to ready, the JDK agent, the user story) are what
bench/results/gpu-2026-12-07al/ and docs/gpu-logs/2026-12-07al/ hold, and what sessions AH's and AJ's files hold
where the text compares."""

from __future__ import annotations

import json
import re

from helpers import REPO
from helpers import answered_level as level
from helpers import doc_section, flat

RESULTS = REPO / "bench" / "results" / "gpu-2026-12-07al"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-07al"
BENCH_HEADING = "### The builders started with the Explorer (session AL"
BENCH_DOC = REPO / "docs" / "benchmarks.md"
GPU_DOC = REPO / "docs" / "gpu-results.md"
LEVELS = (("c=32 equal (1024)", "load", 32), ("c=64 equal (2048)", "load", 64), ("c=32 spread (1024)", "load_spread", 32),
          ("c=64 spread (2048)", "load_spread", 64))  # fmt: skip
# the earlier H100 first levels after ready with the builders on (started with the proxy's app then)
EARLIER_FIRST = (("gpu-2026-12-06ah/serve-qwen3b-build1.json", "trinity-build", "load"),
                 ("gpu-2026-12-06ah/serve-qwen3b-build2.json", "trinity-build", "load"),
                 ("gpu-2026-12-06ah/serve-qwen3b-abba3.json", "trinity-build", "load"),
                 ("gpu-2026-12-06aj/serve-qwen3b-warmup1.json", "trinity", "warmup_level"))  # fmt: skip


def bench_text() -> str:
    return flat(doc_section(BENCH_HEADING))


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def ratio(run: dict, key: str, c: int) -> float:
    return level(run, "trinity", key, c)["output_tokens_per_s"] / level(run, "bare", key, c)["output_tokens_per_s"]


def p99(run: dict, phase: str, key: str = "load", c: int = 32) -> float:
    return level(run, phase, key, c)["latency_s"]["p99"]


def test_the_table_is_the_run():
    run = result("serve-qwen3b-abba1.json")
    assert run["settings"]["warmup_level"] == "" and list(run["phases"]) == ["bare", "trinity"]
    assert run["settings"]["env"]["RFTSTACK_PROXY_BUILD_PROCESSES"] is None  # today's defaults: the builders on
    table = doc_section(BENCH_HEADING)
    for name, key, c in LEVELS:
        b, t = level(run, "bare", key, c), level(run, "trinity", key, c)
        bare = f"{b['output_tokens_per_s']:.0f}, {b['latency_s']['p50']:.3f} / {b['latency_s']['p99']:.3f}"
        proxy = f"{t['output_tokens_per_s']:.0f} ({ratio(run, key, c):.2f}), {t['latency_s']['p50']:.3f} / {t['latency_s']['p99']:.3f}"
        row = f"| {name} | {bare} | {proxy} | {t['latency_s']['p99'] / b['latency_s']['p99']:.2f} |"
        assert row in table, row


def test_the_goals_met_and_not_and_every_answer_an_experience():
    run = result("serve-qwen3b-abba1.json")
    t = bench_text()
    r = {(k, c): ratio(run, k, c) for _, k, c in LEVELS}
    ready = run["phases"]["trinity"]["ready"]["first_answer_s"] / run["phases"]["bare"]["ready"]["first_answer_s"]
    met = [r["load", 32] >= 0.95, p99(run, "trinity") / p99(run, "bare") <= 1.25, ready <= 1.5]
    assert all(met) and r["load", 64] < 0.95 and r["load_spread", 64] < 0.95 and r["load_spread", 32] < 0.95
    assert f"not c=64 equal ({r['load', 64]:.3f} before rounding) nor c=64 spread ({r['load_spread', 64]:.2f})" in t
    metrics = run["phases"]["trinity"]["proxy_metrics"]
    requests, experiences = metrics["rollout/model_0/total_request_count"], metrics["rollout/total_experience_count"]
    assert requests == experiences and f"{requests} requests, {experiences} experiences" in t
    preface = flat(BENCH_DOC.read_text().split("## 1. Serving")[0])
    assert (f"0.{round(r['load', 32] * 100)} (c=32 equal), {r['load', 64]:.2f} (c=64 equal, {r['load', 64]:.3f}), "
            f"{r['load_spread', 32]:.2f} / {r['load_spread', 64]:.2f} (c=32 / c=64 spread), p99 "
            f"{p99(run, 'trinity') / p99(run, 'bare'):.2f} at c=32, warm ready {ready:.2f}") in preface  # fmt: skip


def test_the_first_levels_tail_against_the_earlier_h100_runs():
    run = result("serve-qwen3b-abba1.json")
    earlier = []
    for path, phase, key in EARLIER_FIRST:
        other = json.loads((REPO / "bench" / "results" / path).read_text())
        earlier.append((p99(other, phase, key), p99(other, "bare", key)))
    proxy, bare = p99(run, "trinity"), p99(run, "bare")
    t = bench_text()
    assert f"the proxy's own p99 there, {proxy:.3f} s, is only {min(p for p, _ in earlier) - proxy:.3f} s below" in t
    assert f"({min(p for p, _ in earlier):.3f}-{max(p for p, _ in earlier):.3f} s)" in t
    assert bare > max(b for _, b in earlier)  # "bare's was higher than in any of them"
    assert f"bare's ({bare:.3f} s here, {min(b for _, b in earlier):.3f}-{max(b for _, b in earlier):.3f} s there)" in t
    ah = sorted(p / b for p, b in earlier[:3])
    assert f"p99 {ah[0]:.2f}-{ah[-1]:.2f} of bare and session AJ's warm-up level {earlier[3][0] / earlier[3][1]:.2f}" in t
    assert f"here {proxy / bare:.2f}" in t
    al1 = flat(doc_section("### AL1.", GPU_DOC))
    assert f"first-level p99 ({proxy:.3f} s) was {min(p for p, _ in earlier) - proxy:.3f} s below the lowest" in al1


def test_time_to_ready_and_the_compiles_of_the_first_serves():
    run, late = result("serve-qwen3b-abba1.json"), result("serve-qwen3b-warm-late.json")
    s = {ph: v["ready"]["first_answer_s"] for ph, v in run["phases"].items()}
    t = bench_text()
    assert f"bare {s['bare']:.2f} s, `rftstack serve` **{s['trinity']:.2f} s ({s['trinity'] / s['bare']:.2f}x)**" in t
    files = [late["phases"][ph]["compile_cache_before"]["files"] for ph in ("bare", "trinity", "trinity-late")]
    files.append(run["phases"]["bare"]["compile_cache_before"]["files"])  # the next step, on the same machine
    grew = [b - a for a, b in zip(files, files[1:])]
    assert grew[0] > 0 and grew[1] > 0 and grew[2] == 0
    assert f"grew by {grew[0]} and {grew[1]} files during their phases), `trinity-late` found `trinity`'s (0 new files)" in t
    cold = {ph: v["ready"]["first_answer_s"] for ph, v in late["phases"].items()}
    assert late["phases"]["trinity-late"]["env"] == {"RFTSTACK_PROXY_BUILDERS_EARLY": "0"}
    assert f"bare {cold['bare']:.2f} s, `trinity` {cold['trinity']:.2f} s, `trinity-late` {cold['trinity-late']:.2f} s" in t
    assert f"({cold['bare']:.2f}, {cold['trinity']:.2f}, {cold['trinity-late']:.2f} s)" in flat(doc_section("### AL1.", GPU_DOC))


def test_the_steps_and_the_install():
    steps = (LOGS / "steps.txt").read_text()
    for line in ("end java rc=0 90 s", "end rl rc=0 92 s", "end ready-3b-late rc=0 218 s",
                 "end proxy3b-abba rc=0 210 s", "all done", "SigIgn:\t0000000001001000", "doctor: ok"):
        assert line in steps, line
    assert "bundle 0b9c8ad419bd: installed 191 wheels" in (LOGS / "install.log").read_text()
    printed = (LOGS / "go-printed.txt").read_text()
    assert "install rc=3 60 s" in printed and "(its package files and 27 patches)" in printed
    assert "trinity-proxy-builders-early.patch: trinity/explorer/explorer.py: already applied" in (LOGS / "patches.log").read_text()
    head = flat(GPU_DOC.read_text().split("### AL1.")[0].split("## Session AL (")[1])
    for claim in ("bundle `0b9c8ad419bd`, 191 files", "installed in 60 s", "`same_tree.py` matched (27 patches)",
                  "`java` 90 s, `rl` 92 s, `ready-3b-late` 218 s, `proxy3b-abba` 210 s", 'ABBA_ORDERS="1:bare,trinity"'):
        assert claim in head, claim
    assert re.search(r"--label qwen3b-abba1 --phases bare,trinity ", result("serve-qwen3b-abba1.json")["command"])


def test_the_clients_with_the_patch():
    java = (LOGS / "java.log").read_text()
    agent = json.loads(next(ln for ln in java.splitlines() if ln.startswith('{"wall_s"')))
    assert (agent["agents"], agent["requests_ok"], agent["requests_failed"], agent["rewarded"]) == (8, 56, 0, 40)
    assert agent["http"] == "default (HTTP_2)" and re.search(r"^=+ 1 passed in", java, re.M)
    assert re.search(r"^=+ 12 passed in 89\.13s", (LOGS / "rl.log").read_text(), re.M)
    t = flat(GPU_DOC.read_text().split("### AL2.")[1].split("\n## ")[0])
    assert "8 agents, 56 of 56 requests, 0 failed, 40 rewarded, passed" in t and "**12 of 12 passed** in 92 s" in t


def test_the_spread_loss_that_proxy3b_spread_direct_is_for():
    """bench/README.md's figures for the long runs of the builders without a warm-up level on H100s (AH's three, AL's)."""
    runs = [(path, phase) for path, phase, key in EARLIER_FIRST if key == "load"]
    runs.append(("gpu-2026-12-07al/serve-qwen3b-abba1.json", "trinity"))
    spread, equal, bare_lost, proxy_lost = [], [], [], []
    for path, phase in runs:
        run = json.loads((REPO / "bench" / "results" / path).read_text())
        tok = {(p, k): level(run, p, k, 64)["output_tokens_per_s"] for p in ("bare", phase) for k in ("load", "load_spread")}
        spread.append(tok[phase, "load_spread"] / tok["bare", "load_spread"])
        equal.append(tok[phase, "load"] / tok["bare", "load"])
        bare_lost.append(1 - tok["bare", "load_spread"] / tok["bare", "load"])
        proxy_lost.append(1 - tok[phase, "load_spread"] / tok[phase, "load"])
    assert all(p > b for p, b in zip(proxy_lost, bare_lost))  # "more in each run"
    readme = flat((REPO / "bench" / "README.md").read_text())
    span = lambda xs, f="{:.2f}": f"{f.format(min(xs))}-{f.format(max(xs))}"  # noqa: E731
    assert f"the proxy served {span(spread)} of bare at c=64 with spread lengths" in readme
    assert f"with equal lengths it served {span(equal)}" in readme
    pct = [round(x * 100) for x in bare_lost], [round(x * 100) for x in proxy_lost]
    assert f"bare lost {min(pct[0])}-{max(pct[0])} % against its own equal-length level, the proxy {min(pct[1])}-{max(pct[1])} %, more in each run" in readme
