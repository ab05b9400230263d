"""docs/benchmarks.md's and docs/gpu-results.md's session AO claims (2026-12-07, H100: `rftstack serve` and bare
`vllm serve` up together on one GPU, the long runs' levels interleaved over four rounds, with the GPU's busy and idle
time an engine step) are what bench/results/gpu-2026-12-07ao/ and docs/gpu-logs/2026-12-07ao/ hold; both tables are
bench/interleave.py's output."""

from __future__ import annotations

import json
import re

import interleave  # bench/
from helpers import REPO, doc_section, flat

RESULT = REPO / "bench" / "results" / "gpu-2026-12-07ao" / "interleave-qwen3b.json"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-07ao"
BENCH_HEADING = "### Bare and the serve up together, their loads interleaved (session AO"
GPU_DOC = REPO / "docs" / "gpu-results.md"
BENCH_DOC = REPO / "docs" / "benchmarks.md"


def run() -> dict:
    return json.loads(RESULT.read_text())


def section() -> str:
    return doc_section(BENCH_HEADING)


def text() -> str:
    return flat(section())


def f2(x: float) -> str:
    return f"{x:.2f}"


def test_both_tables_are_interleaves_output():
    r = run()
    assert interleave.table(r) in section()
    assert interleave.steps_table(r) in section()
    for cmd in (f"python bench/interleave.py --table {RESULT.relative_to(REPO)}",
                f"python bench/interleave.py --table {RESULT.relative_to(REPO)} --steps"):
        assert cmd + "\n" in section()


def test_the_run_is_the_step_the_section_names():
    """Four rounds, three paths, bare leading rounds 1 and 4, 16 requests a client, 0.4 of the memory each, the host
    step's command (host_session.sh's interleave3b with INTERLEAVE_ROUNDS and INTERLEAVE_ARGS) and its seconds."""
    r = run()
    assert [x["order"][0] for x in r["rounds"]] == ["bare", "trinity", "engine", "bare"]
    assert list(r["paths"]) == ["bare", "trinity", "engine"] and r["paths"]["engine"]["request"] == "numeric"
    assert r["requests_per_client"] == 16 and r["gpu_util"] == 0.4 and r["max_tokens"] == 64
    assert "--rounds 4 --engine-direct" in r["command"]
    session = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    assert '--rounds "${INTERLEAVE_ROUNDS:-4}" ${INTERLEAVE_ARGS:-}' in session
    assert 'INTERLEAVE_ROUNDS=4 INTERLEAVE_ARGS="--engine-direct" bash tests/gpu/host_session.sh interleave3b   # 535 s' in section()
    assert "end interleave3b rc=0 535 s" in (LOGS / "steps.txt").read_text()
    t = text()
    assert "each with 0.4 of its memory" in t and "16 requests a client: 512 at c=32, 1024 at c=64" in t
    assert "bare led rounds 1 and 4" in t


def test_ready_times_and_both_compiles_are_the_logs():
    r = run()
    serve, bare = r["servers"]["trinity"]["ready"]["first_answer_s"], r["servers"]["bare"]["ready"]["first_answer_s"]
    assert f"the serve was ready after {serve} s and bare after {bare} s (both compiled the model" in text()
    assert "Compiling a graph for compile range" in (LOGS / "interleave-qwen3b-serve.log").read_text()
    assert "Compiling a graph for compile range" in (LOGS / "interleave-qwen3b-bare-no-access.log").read_text()
    install = (LOGS / "install.log").read_text()
    assert "bundle d22ae0668627: installed 191 wheels" in install
    printed = (LOGS / "go-printed.txt").read_text()
    assert "the installed rftstack matches /tmp/repo (its package files and 27 patches)" in printed
    assert "install rc=3 58 s" in printed and "installed in 58 s" in text() and "matched (27 patches)" in text()


def test_the_pooled_figures_and_their_spread_are_the_results():
    figs = interleave.figures(run())
    t = text()
    pooled = {k: f2(v["trinity"]["pooled"]) for k, v in figs.items()}
    engine = {k: f2(v["engine"]["pooled"]) for k, v in figs.items()}
    assert pooled == {"c=32 equal": "0.88", "c=64 equal": "0.83", "c=32 spread": "0.82", "c=64 spread": "0.78"}
    assert engine == {"c=32 equal": "0.93", "c=64 equal": "0.86", "c=32 spread": "0.94", "c=64 spread": "0.87"}
    assert ("the proxy served 0.83 of bare at c=64 equal, 0.88 at c=32 equal, 0.78 at c=64 spread and 0.82 at c=32 "
            "spread; no round of any level reached 0.95 (the highest 0.91)") in t
    rounds = [x for v in figs.values() for x in v["trinity"]["rounds"]]
    assert max(rounds) < 0.95 and f2(max(rounds)) == "0.91"
    spans = [v["trinity"]["max"] - v["trinity"]["min"] for v in figs.values()]
    assert f"{min(spans):.2f}-{max(spans):.2f}" == "0.06-0.12" and "the proxy's ratios by 0.06-0.12" in t
    p99 = figs["c=32 equal"]["trinity"]["p99_rounds"]
    assert f"(p99 at c=32 equal {f2(min(p99))}-{f2(max(p99))})" in t
    moved = [max(v["trinity"]["bare_tok_s"]) / min(v["trinity"]["bare_tok_s"]) - 1 for v in figs.values()]
    assert f"{min(moved) * 100:.0f}-{max(moved) * 100:.0f} %" == "12-27 %" and "moved by 12-27 % from round to round" in t
    assert ("Trinity's engine sent the proxy's own request served 0.86 of bare's plain requests at c=64 and 0.93 at "
            "c=32 (the proxy 0.83 and 0.88); at spread lengths the engine served 0.87 and 0.94 and the proxy lost 0.09 "
            "and 0.12 more (0.78, 0.82)") in t
    lost = [figs[f"c={c} spread"]["engine"]["pooled"] - figs[f"c={c} spread"]["trinity"]["pooled"] for c in (64, 32)]
    assert [f2(x) for x in lost] == ["0.09", "0.12"]


def test_the_steps_figures_are_the_results():
    st = interleave.steps(run())
    t = text()
    busy = [v["gpu_busy_ms_per_step"] for per in st.values() for v in per.values()]
    assert f"The GPU was busy {f2(min(busy))}-{f2(max(busy))} ms an engine step on every path at every level" in t
    idle = {k: [f2(per[p]["gpu_idle_ms_per_step"]) for p in ("bare", "engine", "trinity")] for k, per in st.items()}
    assert idle["c=64 equal"] == ["0.83", "1.22", "1.34"] and "at c=64 equal 0.83 ms for bare, 1.22 for" in t
    assert idle["c=64 spread"] == ["2.39", "2.78", "3.77"] and "at c=64 spread 2.39, 2.78 and 3.77" in t
    assert idle["c=32 spread"] == ["1.42", "1.61", "2.26"] and "at c=32 spread 1.42, 1.61 and 2.26" in t
    bare_cores = [per["bare"]["busy_cores"] for per in st.values()]
    serve_cores = [per[p]["busy_cores"] for per in st.values() for p in ("trinity", "engine")]
    assert f"{min(bare_cores):.1f}-{max(bare_cores):.1f} busy cores of 16 while bare served" in t
    assert f"{min(serve_cores):.1f}-{max(serve_cores):.1f} while the serve did" in t
    assert run()["machine"]["cpus"] == 16


def test_every_answer_through_the_proxy_was_200_and_its_count_is_said_missing():
    r = run()
    lvs = [rd["levels"][k]["trinity"] for rd in r["rounds"] for k in rd["levels"]]
    assert sum(x["ok"] for x in lvs) == sum(x["requests"] for x in lvs) == 12288
    assert "proxy_metrics" not in r["servers"]["trinity"]  # recorded since this run
    assert "this run's 12288 answers through the proxy, all 200, were not counted against the store" in text()


def test_gpu_results_and_the_preface_say_the_same():
    figs = interleave.figures(run())
    gpu = flat(GPU_DOC.read_text())
    row = next(ln for ln in GPU_DOC.read_text().splitlines() if "(`interleave3b` with `--engine-direct`; session AO" in ln)
    for k in ("c=64 equal", "c=32 equal", "c=64 spread", "c=32 spread"):
        assert f2(figs[k]["trinity"]["pooled"]) in row and f2(figs[k]["engine"]["pooled"]) in row
    assert "idle between steps 0.83 (bare), 1.22 (engine), 1.34 ms (proxy) at c=64 equal, 2.39 / 2.78 / 3.77 at c=64 spread" in row
    assert "## Session AO (2026-12-07, 14:44-14:58 UTC, H100)" in gpu and "Given back with 264 s left." in gpu
    assert re.search(r"Sessions AB, AC, AE, AF, AH, AI, AJ, AL, AM, AN and AO got an H100 80GB", gpu)
    preface = flat(BENCH_DOC.read_text().split("## 1. Serving")[0])
    assert ("Pooled 0.83 (c=64 equal), 0.78 (c=64 spread), 0.88 (c=32 equal), 0.82 (c=32 spread), each figure's four "
            "rounds 0.06-0.12 apart") in preface
    assert "0.86 / 0.93 at equal lengths (c=64 / c=32), 0.87 / 0.94 at spread lengths" in preface
    assert "the GPU worked the same 3.3-3.6 ms an engine step" in preface


def test_bare_moved_by_up_to_19_percent_between_session_ans_runs():
    """The section's premise: from one long run to the next on one machine (session AN's three), bare's c=64 equal."""
    from helpers import answered_tok_s

    an = REPO / "bench" / "results" / "gpu-2026-12-07an"
    bare = [answered_tok_s(json.loads((an / n).read_text()), "bare", "load", 64)
            for n in ("serve-qwen3b-spread-direct.json", "serve-qwen3b-abba2.json", "serve-qwen3b-abba1-2.json")]
    assert f"{(max(bare) / min(bare) - 1) * 100:.0f} %" == "19 %"
    assert "bare alone moved by up to 19 % (session AN, below)" in text()


def test_bench_readme_says_what_the_steps_table_shows():
    st = interleave.steps(run())
    busy = [v["gpu_busy_ms_per_step"] for per in st.values() for v in per.values()]
    readme = flat((REPO / "bench" / "README.md").read_text())
    assert f"the GPU was busy the same {min(busy):.1f}-{max(busy):.1f} ms an engine step on every path" in readme
    assert all(per["trinity"]["gpu_idle_ms_per_step"] > per["bare"]["gpu_idle_ms_per_step"] for per in st.values())
    assert "python bench/interleave.py --table bench/results/gpu-2026-12-07ao/interleave-qwen3b.json --steps" in readme
    assert "interleave3b-engine)" in (REPO / "tests" / "gpu" / "host_session.sh").read_text()
