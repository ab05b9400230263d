"""docs/benchmarks.md's and docs/gpu-results.md's session AJ claims (2026-12-06, H100: the long run with a warm-up
level, warm time to ready, the JDK agent, the bad requests, the user story) are what bench/results/gpu-2026-12-06aj/
and docs/gpu-logs/2026-12-06aj/ hold."""

from __future__ import annotations

import json
import re

from helpers import REPO
from helpers import answered_level as level
from helpers import doc_section

RESULTS = REPO / "bench" / "results" / "gpu-2026-12-06aj"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-06aj"
BENCH_HEADING = "### A warm-up level before the measured ones (session AJ"
GPU_DOC = REPO / "docs" / "gpu-results.md"
PHASES = ("bare", "trinity", "trinity-nobuild")
LEVELS = (("warm-up c=32 equal (512, not measured)", "warmup_level", 32), ("c=32 equal (1024)", "load", 32),
          ("c=64 equal (2048)", "load", 64), ("c=32 spread (1024)", "load_spread", 32),
          ("c=64 spread (2048)", "load_spread", 64))


def bench_text() -> str:
    return " ".join(doc_section(BENCH_HEADING).split())


def gpu_text(heading: str) -> str:
    return " ".join(doc_section(heading, GPU_DOC).split())


def warmup_run() -> dict:
    return json.loads((RESULTS / "serve-qwen3b-warmup1.json").read_text())


def test_the_table_is_the_run():
    run = warmup_run()
    assert run["settings"]["warmup_level"] == "32:512"
    table = doc_section(BENCH_HEADING)
    for name, key, c in LEVELS:
        cells = []
        for phase in PHASES:
            lv = level(run, phase, key, c)
            lat = lv["latency_s"]
            tok = lv["output_tokens_per_s"]
            ratio = "" if phase == "bare" else f" ({tok / level(run, 'bare', key, c)['output_tokens_per_s']:.2f})"
            cells.append(f"{tok:.0f}{ratio}, {lat['p50']:.3f} / {lat['p99']:.3f}")
        build = level(run, "trinity", key, c)["output_tokens_per_s"] / level(run, "trinity-nobuild", key, c)["output_tokens_per_s"]
        row = f"| {name} | {' | '.join(cells)} | {build:.3f} |"
        assert row in table, row


def test_the_p99_claims_and_the_builders_lead():
    run = warmup_run()
    p99 = {ph: level(run, ph, "load", 32)["latency_s"]["p99"] for ph in PHASES}
    warm = {ph: level(run, ph, "warmup_level", 32)["latency_s"]["p99"] for ph in PHASES}
    assert max(warm, key=warm.__getitem__) == "trinity" and min(p99, key=p99.__getitem__) == "trinity"
    t = bench_text()
    assert f"p99 / bare at c=32 **{p99['trinity'] / p99['bare']:.2f}** with builders, {p99['trinity-nobuild'] / p99['bare']:.2f} without" in t
    leads = [level(run, "trinity", k, c)["output_tokens_per_s"] / level(run, "trinity-nobuild", k, c)["output_tokens_per_s"]
             for _, k, c in LEVELS[1:]]
    assert all(x > 1 for x in leads)
    assert f"(by {(min(leads) - 1) * 100:.1f} to {(max(leads) - 1) * 100:.1f} %)" in t


def test_bare_was_slower_than_session_ahs():
    run = warmup_run()
    here = level(run, "bare", "load", 64)["output_tokens_per_s"]
    runs = [json.loads(p.read_text()) for p in sorted((REPO / "bench" / "results" / "gpu-2026-12-06ah").glob("serve-qwen3b-*.json"))]
    ah = {c: sorted(level(r, "bare", "load", c)["output_tokens_per_s"] for r in runs) for c in (32, 64)}
    assert len(runs) == 3
    slower = sorted(round((1 - here / x) * 100) for x in ah[64])
    claim = f"{slower[0]}-{slower[-1]} % slower than session AH's at c=64"
    assert claim in " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    span = " and ".join(f"{ah[c][0]:.0f}-{ah[c][-1]:.0f}" for c in (32, 64))
    assert f"bare here served {level(run, 'bare', 'load', 32)['output_tokens_per_s']:.0f} and {here:.0f}" in bench_text()
    assert f"where it served {span} on session AH's machine" in bench_text()


def test_warm_and_cold_time_to_ready():
    ready = json.loads((RESULTS / "serve-qwen3b-warm-exec.json").read_text())["phases"]
    s = {ph: ready[ph]["ready"]["first_answer_s"] for ph in ready}
    t = bench_text()
    assert f"bare {s['bare']:.2f} s, `rftstack serve` **{s['trinity']:.2f} s ({s['trinity'] / s['bare']:.2f}x)**" in t
    assert f"uni executor {s['trinity-uni']:.2f} s ({s['trinity-uni'] / s['bare']:.2f}x)" in t
    assert f"spawned {s['trinity-mp']:.2f} s ({s['trinity-mp'] / s['bare']:.2f}x)" in t
    cold = {ph: v["ready"]["first_answer_s"] for ph, v in warmup_run()["phases"].items()}
    assert f"bare {cold['bare']:.2f} s, `trinity` {cold['trinity']:.2f} s, `trinity-nobuild` {cold['trinity-nobuild']:.2f} s" in t
    lines = (LOGS / "builders-lines.txt").read_text().splitlines()
    assert len(lines) == 4 and all(
        "Experience builders: 4 processes (RFTSTACK_PROXY_BUILD_PROCESSES unset: auto, rftstack patch)" in ln for ln in lines)


def test_the_steps_and_the_install():
    s1, s2, s3 = ((LOGS / f"steps-{i}.txt").read_text() for i in (1, 2, 3))
    for line in ("end java rc=0 103 s", "end bad rc=1 94 s", "end proxy3b-warmup rc=0 439 s",
                 "end ready-3b-exec rc=0 219 s", "all done", "SigIgn:\t0000000001001000"):
        assert line in s1, line
    assert "end bad rc=0 61 s" in s2 and "end rl rc=0 96 s" in s3
    assert "bundle 1faf2d6c39bf: installed 191 wheels" in (LOGS / "install.log").read_text()
    head = " ".join(GPU_DOC.read_text().split("### AJ1.")[0].split("## Session AJ (")[1].split())
    for claim in ("`java` 103 s, `bad` 94 s (failed), `proxy3b-warmup` 439 s, `ready-3b-exec` 219 s",
                  "`host_session.sh bad` 61 s", "`host_session.sh rl` 96 s", "bundle `1faf2d6c39bf`, 191 files"):
        assert claim in head, claim


def test_the_clients_and_the_bad_requests():
    java = (LOGS / "java.log").read_text()
    agent = json.loads(next(ln for ln in java.splitlines() if ln.startswith('{"wall_s"')))
    assert (agent["agents"], agent["requests_ok"], agent["requests_failed"], agent["rewarded"]) == (8, 56, 0, 40)
    assert agent["http"] == "default (HTTP_2)" and re.search(r"^=+ 1 passed in", java, re.M)
    bad1, bad2 = (LOGS / "bad-1.log").read_text(), (LOGS / "bad-2.log").read_text()
    assert "Please request fewer output tokens. (parameter=max_tokens, value=1000000000)" in bad1
    assert "1 failed, 4 deselected" in bad1 and re.search(r"^=+ 1 passed, 4 deselected in", bad2, re.M)
    assert re.search(r"^=+ 12 passed in 93\.68s", (LOGS / "rl.log").read_text(), re.M)
    gpu = (REPO / "tests" / "gpu" / "test_reliability_gpu.py").read_text()
    assert 'body["error"]["message"].startswith(\n        "max_tokens=1000000000 cannot be greater than' in gpu
    t = gpu_text("### AJ2.")
    assert "8 agents, 56 of 56 requests, 0 failed, 40 rewarded, passed" in t and "**12 of 12 passed** in 96 s" in t
    assert "rerun on the same machine it **passed**" in t
