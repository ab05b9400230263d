"""docs/benchmarks.md's session AH claims (2026-12-06, H100) are what bench/results/gpu-2026-12-06ah/ holds: the
experience builders (patches/trinity-proxy-build-processes.patch, RFTSTACK_PROXY_BUILD_PROCESSES=auto) in serve mode
beside the proxy building on its own loop and bare vLLM, three orders on one machine (host_session.sh proxy3b-build,
then proxy3b-abba with ABBA_ORDERS), and before the test double on the host's CPU (proxycpu-build); the default
switched on them; docs/serve.md and docs/gpu-results.md say the same."""

from __future__ import annotations

import json

import run_spread
import summary_table
from helpers import REPO
from helpers import doc_section

R = REPO / "bench" / "results" / "gpu-2026-12-06ah"
RUNS = (R / "serve-qwen3b-build1.json", R / "serve-qwen3b-build2.json", R / "serve-qwen3b-abba3.json")
HOSTCPU = R / "proxy-overhead-host-build.json"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-06ah"
HEADING = "### The experience builders in serve mode (session AH"
LEVELS = (("load", 32, "c=32 equal"), ("load", 64, "c=64 equal"), ("load_spread", 32, "c=32 spread"),
          ("load_spread", 64, "c=64 spread"))


def text() -> str:
    return " ".join(doc_section(HEADING).split())


def load(path) -> dict:
    return json.loads(path.read_text())


def tok_s(result: dict, phase: str, key: str, c: int) -> float | None:
    if phase not in result["phases"]:
        return None
    return run_spread._tok_s(result, phase, key, c, "doc")


def p(result: dict, phase: str, c: int, q: str) -> float:
    return next(lv for lv in result["phases"][phase]["load"]["levels"] if lv["concurrency"] == c)["latency_s"][q]


def table() -> str:
    """The section's table from the three files: per run and level, output tokens/s of each server, each proxy's
    ratio to the same run's bare, and the builders' to the proxy building itself."""
    rows = ["| run | level | bare | trinity, built on the loop | trinity-build (auto) | build / loop |",
            "|---|---|---|---|---|---|"]
    for path in RUNS:
        r = load(path)
        for key, c, name in LEVELS:
            bare, loop, build = (tok_s(r, ph, key, c) for ph in ("bare", "trinity", "trinity-build"))
            cell = lambda v: "-" if v is None else f"{v:.0f} ({v / bare:.2f})"  # noqa: E731
            ratio = "-" if loop is None else f"{build / loop:.3f}"
            rows.append(f"| {r['label']} | {name} | {bare:.0f} | {cell(loop)} | {cell(build)} | {ratio} |")
    return "\n".join(rows)


def pairs() -> list[float]:
    return [tok_s(r, "trinity-build", key, c) / tok_s(r, "trinity", key, c)
            for r in map(load, RUNS) if "trinity" in r["phases"] for key, c, _ in LEVELS]


def test_the_runs_are_the_steps_and_the_machine_the_section_names():
    sec = doc_section(HEADING)
    assert "bash tests/gpu/host_session.sh proxy3b-build proxycpu-build" in sec
    assert 'ABBA_ORDERS="3:trinity,trinity-build,bare" bash tests/gpu/host_session.sh proxy3b-abba' in sec
    s1, s2 = (LOGS / "steps-1.txt").read_text(), (LOGS / "steps-2.txt").read_text()
    assert "end proxy3b-build rc=0 610 s" in s1 and "end proxycpu-build rc=0 75 s" in s1
    assert "end proxy3b-abba rc=0 304 s" in s2 and "610 s, 75 s and 304 s" in sec
    # reproducible today, where `trinity` has the builders: the step and the third order name trinity-nobuild
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    assert "proxy3b-build) for order in 1:bare,trinity-build,trinity-nobuild 2:trinity-build,bare;" in script
    assert 'ABBA_ORDERS="3:trinity-nobuild,trinity-build,bare" bash tests/gpu/host_session.sh proxy3b-abba' in sec
    assert "bash tests/gpu/host_session.sh proxy3b-build proxycpu-build" in (REPO / "bench" / "README.md").read_text()
    for path, order in zip(RUNS, (["bare", "trinity-build", "trinity"], ["trinity-build", "bare"],
                                  ["trinity", "trinity-build", "bare"])):
        r = load(path)
        assert list(r["phases"]) == order and "--rounds 32" in r["command"]
        assert r["machine"]["gpu"].startswith("NVIDIA H100")
        # the builders' phase alone set the variable: `trinity` was the loop's building, the default then
        assert {ph: r["phases"][ph].get("env") for ph in order} == {
            ph: {"RFTSTACK_PROXY_BUILD_PROCESSES": "auto"} if ph == "trinity-build" else None for ph in order}
    assert "bundle 69e9a90504e6: installed 191 wheels" in (LOGS / "install.log").read_text()
    assert "`69e9a90504e6`" in sec
    # the steps' processes took SIGINT (go.sh's detach.py): neither 0x2 nor 0x4 in the mask
    for steps in (s1, s2, (LOGS / "steps-3.txt").read_text()):
        mask = int(steps.split("signals ignored: SigIgn:", 1)[1].split()[0], 16)
        assert not mask & 0x6


def test_the_table_is_the_three_files():
    assert table() in doc_section(HEADING)


def test_the_reading_of_the_pairs():
    t, ratios = text(), pairs()
    assert len(ratios) == 8 and min(ratios) > 1.0
    assert f"ahead in all {len(ratios)} pairs, by {100 * (min(ratios) - 1):.1f} to {100 * (max(ratios) - 1):.1f} %" in t
    build32 = [tok_s(r, "trinity-build", "load", 32) / tok_s(r, "bare", "load", 32) for r in map(load, RUNS)]
    loop32 = [tok_s(r, "trinity", "load", 32) / tok_s(r, "bare", "load", 32) for r in map(load, RUNS)
              if "trinity" in r["phases"]]
    assert f"at c=32 equal {min(build32):.2f}-{max(build32):.2f} of bare with builders, " \
           f"{min(loop32):.2f}-{max(loop32):.2f} without" in t


def test_the_latency_reading():
    t = text()
    a, c = load(RUNS[0]), load(RUNS[2])
    p50 = [f"{p(r, ph, 32, 'p50'):.3f}" for r in (a, c) for ph in ("trinity-build", "trinity")]
    assert f"median at c=32 lower with them ({p50[0]} against {p50[1]} s, {p50[2]} against {p50[3]} s)" in t
    p99 = [f"{p(r, ph, 32, 'p99'):.3f}" for r in (a, c) for ph in ("trinity-build", "trinity")]
    assert f"p99 higher ({p99[0]} against {p99[1]} s, {p99[2]} against {p99[3]} s)" in t
    assert float(p99[0]) > float(p99[1]) and float(p99[2]) > float(p99[3])
    ratios = {ph: [p(r, ph, 32, "p99") / p(r, "bare", 32, "p99") for r in map(load, RUNS) if ph in r["phases"]]
              for ph in ("trinity-build", "trinity")}
    b, lp = ratios["trinity-build"], ratios["trinity"]
    assert f"p99 / bare at c=32 {b[0]:.2f}, {b[1]:.2f} and {b[2]:.2f} with builders, {lp[0]:.2f} and {lp[1]:.2f} without" in t
    # summary_table's own p99 figure is the same ratio
    assert summary_table.p99_ratio(a, "doc") == lp[0]


def test_the_host_cpu_figures():
    s = load(HOSTCPU)["summary"]
    b, g = s["sqlite-build4"], s["sqlite-gc"]
    assert (f"four builders {b['32']['vs_direct']:.3f} / {b['64']['vs_direct']:.3f} of direct at c=32 / c=64, the proxy "
            f"building itself {g['32']['vs_direct']:.3f} / {g['64']['vs_direct']:.3f}") in text()


def test_the_user_story_and_the_java_agent_ran_with_the_builders():
    steps = (LOGS / "steps-3.txt").read_text()
    assert "end rl rc=0" in steps and "end java rc=0" in steps
    assert "12 passed" in (LOGS / "rl.log").read_text() and "1 passed" in (LOGS / "java.log").read_text()
    assert '"requests_ok": 56, "requests_failed": 0' in (LOGS / "java.log").read_text()
    lines = (LOGS / "builders-lines.txt").read_text()
    said = "Experience builders: 4 processes (RFTSTACK_PROXY_BUILD_PROCESSES=auto, rftstack patch), pids "
    # each serve's line is in its trinity.log and its explorer.log: two serves, two sets of four pids
    assert len({line.split(said, 1)[1].strip() for line in lines.splitlines() if said in line}) == 2
    t = text()
    assert "RFTSTACK_PROXY_BUILD_PROCESSES=auto host_session.sh rl java" in t
    assert "12 of 12" in t and "56 of 56" in t


def test_serve_md_gpu_results_and_the_summary_say_the_default():
    serve = " ".join((REPO / "docs" / "serve.md").read_text().split())
    assert "unset or `auto`, the default since session AH" in serve
    assert "the default until the GPU host" not in serve
    gpu = " ".join((REPO / "docs" / "gpu-results.md").read_text().split())
    assert "## Session AH (2026-12-06" in gpu
    summary = " ".join(doc_section("## Summary").split())
    ratios = pairs()
    assert (f"ahead of the proxy's own building in all {len(ratios)} pairs of two long runs, by "
            f"{100 * (min(ratios) - 1):.1f} to {100 * (max(ratios) - 1):.1f} %") in summary
    assert "They are the default since. Not an H200 run: the table stayed session P's." in summary
