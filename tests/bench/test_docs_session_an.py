"""docs/benchmarks.md's, docs/gpu-results.md's and bench/README.md's session AN claims (2026-12-07, H100: the long run
three times on one machine, the engine sent the proxy's request at spread lengths, Trinity's engine beside bare with
Trinity's engine arguments with py-spy on both workers, warm time to ready) are what bench/results/gpu-2026-12-07an/
and docs/gpu-logs/2026-12-07an/ hold; every table is the output of the bench/ script the section names."""

from __future__ import annotations

import json
import re

import engine_table  # bench/
import profile_table  # bench/
import run_spread  # bench/
import stack_frames  # bench/
from summary_table import p99_ratio  # bench/
from helpers import REPO
from helpers import answered_tok_s as tok
from helpers import doc_section, flat

RESULTS = REPO / "bench" / "results" / "gpu-2026-12-07an"
STACKS = RESULTS / "stacks"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-07an"
BENCH_HEADING = "### Three long runs on one machine, the engine at spread again, and the serve's worker under py-spy (session AN"
BENCH_DOC = REPO / "docs" / "benchmarks.md"
GPU_DOC = REPO / "docs" / "gpu-results.md"
README = REPO / "bench" / "README.md"
RUNS = ("serve-qwen3b-spread-direct.json", "serve-qwen3b-abba2.json", "serve-qwen3b-abba1-2.json")
SPREAD = "load_spread"
DIRECT = "load_engine_direct_spread"
TRINITY_ARGS = ("--max-num-batched-tokens 2048 --max-num-seqs 128 --logprobs-mode processed_logprobs --seed 42 "
                "--async-scheduling --distributed-executor-backend mp")  # fmt: skip
WORKER_FRAMES = ("AsyncGPUModelRunnerOutput.get_output", "MessageQueue.dequeue", "GPUModelRunner.execute_model",
                 "Worker.sample_tokens")  # fmt: skip
CORE_FRAMES = ("EngineCore.step_with_batch_queue", "MessageQueue.dequeue", "Scheduler.schedule")


def section() -> str:
    return doc_section(BENCH_HEADING)


def text() -> str:
    return flat(section())


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def ready(run: dict) -> dict[str, float]:
    return {ph: v["ready"]["first_answer_s"] for ph, v in run["phases"].items()}


def test_the_three_runs_are_run_spreads_table(capsys):
    runs = [result(n) for n in RUNS]
    assert [list(r["phases"]) for r in runs] == [["bare", "trinity"], ["trinity", "bare"], ["bare", "trinity"]]
    assert "--engine-direct-spread" in runs[0]["command"]
    assert run_spread.main([str(RESULTS / n) for n in RUNS]) == 0
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert len(table) == 7 and "\n".join(table) in section()
    figures = run_spread.spread([(n, r) for n, r in zip(RUNS, runs)])
    pooled = {k: v["pooled"] for k, v in figures.items() if v.get("pooled") is not None}
    t = text()
    assert (f"Pooled over the three runs {pooled['proxy/bare c=64 equal']:.2f} (c=64 equal), "
            f"{pooled['proxy/bare c=64 spread']:.2f} (c=64 spread), {pooled['proxy/bare c=32 equal']:.2f} (c=32 equal "
            f"and spread)") in t
    assert round(pooled["proxy/bare c=32 equal"], 2) == round(pooled["proxy/bare c=32 spread"], 2)
    assert max(pooled.values()) < 0.95  # "No figure reached 0.95 pooled"
    each = [r for k, v in figures.items() if k.startswith("proxy/bare") for r in v["runs"]]
    assert [x for x in each if x >= 0.95] == [figures["proxy/bare c=64 spread"]["runs"][2]]  # "only one run's one level"
    assert f"({figures['proxy/bare c=64 spread']['runs'][2]:.2f} at c=64 spread in run 3)" in t
    p99 = [p99_ratio(r, n) for n, r in zip(RUNS, runs)]
    assert f"the p99 at c=32 {min(p99):.2f}-{max(p99):.2f}, two of three within the 1.25 goal" in t
    assert sum(x <= 1.25 for x in p99) == 2
    for r in runs:
        m = r["phases"]["trinity"]["proxy_metrics"]
        assert m["rollout/model_0/total_request_count"] == m["rollout/total_experience_count"] == 6161
    assert "6161 requests through the proxy in each, every one an experience" in t


def test_the_engine_at_spread_lengths():
    one = result(RUNS[0])
    engine = [tok(one, "trinity", DIRECT, c) / tok(one, "bare", SPREAD, c) for c in (32, 64)]
    proxy = [tok(one, "trinity", SPREAD, c) / tok(one, "bare", SPREAD, c) for c in (32, 64)]
    of_engine = [tok(one, "trinity", SPREAD, c) / tok(one, "trinity", DIRECT, c) for c in (32, 64)]
    t = text()
    assert (f"served {engine[0]:.2f} / {engine[1]:.2f} of bare's spread levels (c=32 / c=64); the proxy "
            f"{proxy[0]:.2f} / {proxy[1]:.2f}, so {of_engine[0]:.2f} / {of_engine[1]:.2f} of its own engine") in t
    # neither session's engine-direct load sent the proxy's own request: the JSON fields, where the proxy asks for
    # numeric logprobs (its patch on: no switch in the run's environment)
    am_run = json.loads((REPO / "bench" / "results" / "gpu-2026-12-07am" / "serve-qwen3b-spread-direct.json").read_text())
    for run in (one, am_run):
        assert run["phases"]["trinity"][DIRECT]["params"]["like_proxy"] is True
        assert run["settings"]["env"].get("RFTSTACK_PROXY_NUMERIC_LOGPROBS") is None
        assert "engine_direct_request" not in run["phases"]["trinity"]  # recorded since the fix
    serve, _, _ = windows()
    costlier = {c: rate(serve[c], "engine") / rate(serve[c], "engine_numeric") for c in ("64", "32")}
    assert max(costlier.values()) < 1
    assert f"the engine served the JSON fields at {costlier['64']:.2f} / {costlier['32']:.2f} of the numeric ones (c=64 / c=32)" in t
    assert f"its engine served the JSON fields at {costlier['64']:.2f} of the numeric ones at c=64 in AN2's windows" \
        in flat(doc_section("### AN1.", GPU_DOC))
    am = json.loads((REPO / "bench" / "results" / "gpu-2026-12-07am" / "serve-qwen3b-spread-direct.json").read_text())
    am_engine = tok(am, "trinity", DIRECT, 64) / tok(am, "bare", SPREAD, 64)
    am_proxy = tok(am, "trinity", SPREAD, 64) / tok(am, "trinity", DIRECT, 64)
    assert f"in session AM's run the engine served {am_engine:.2f} and the proxy {am_proxy:.2f} of it" in t
    assert f"the engine sent the proxy's fields at spread lengths {engine[0]:.2f} / {engine[1]:.2f} of bare" \
        in flat(GPU_DOC.read_text())
    assert f"The engine at spread: {engine[0]:.2f} / {engine[1]:.2f} of bare (c=32 / c=64), the proxy " \
           f"{of_engine[0]:.2f} / {of_engine[1]:.2f} of its engine" in flat(doc_section("### AN1.", GPU_DOC))
    preface = flat(BENCH_DOC.read_text().split("## 1. Serving")[0])
    assert f"fields at spread lengths served {engine[0]:.2f} / {engine[1]:.2f} of bare this time" in preface


def test_bare_moved_and_the_ready_figures():
    runs = [result(n) for n in RUNS]
    t = text()

    def span(phase: str, key: str) -> str:
        v = [tok(r, phase, key, 64) for r in runs]
        return f"{min(v):.0f}-{max(v):.0f}"

    assert (f"it served {span('bare', 'load')} output tokens/s at c=64 equal and {span('bare', SPREAD)} at c=64 spread; "
            f"the proxy {span('trinity', 'load')} and {span('trinity', SPREAD)}") in t
    late = result("serve-qwen3b-warm-late.json")
    s = ready(late)
    assert not late["summary"].get("compiled_before_ready")
    assert late["phases"]["trinity-late"]["env"] == {"RFTSTACK_PROXY_BUILDERS_EARLY": "0"}
    assert (f"read **{s['trinity'] / s['bare']:.2f}x** (bare {s['bare']:.2f} s, `trinity` {s['trinity']:.2f} s; "
            f"`trinity-late` {s['trinity-late']:.2f} s, {s['trinity-late'] / s['bare']:.2f}x") in t
    assert s["trinity"] / s["bare"] <= 1.5
    two, three = ready(runs[1]), ready(runs[2])
    for r in runs[1:]:
        assert not r["summary"].get("compiled_before_ready")
    assert (f"read {two['trinity'] / two['bare']:.2f}x (run 2: {two['trinity']:.2f} s against {two['bare']:.2f} s) and "
            f"{three['trinity'] / three['bare']:.2f}x (run 3: {three['trinity']:.2f} s against {three['bare']:.2f} s)") in t
    serve = [x["trinity"] for x in (s, two, three)]
    bare = [x["bare"] for x in (s, two, three)]
    assert f"The serve took {min(serve):.0f}-{max(serve):.0f} s in all three, bare {min(bare):.0f}-{max(bare):.0f} s" in t
    one = ready(runs[0])
    assert runs[0]["summary"]["compiled_before_ready"]["bare"] > 0 and runs[0]["summary"]["compiled_before_ready"]["trinity"] > 0
    assert f"Run 1's cold ready: {one['trinity']:.2f} s against {one['bare']:.2f} s ({one['trinity'] / one['bare']:.2f}x)" in t
    row = flat(GPU_DOC.read_text())
    assert f"warm ready **{s['trinity'] / s['bare']:.2f}x** ({s['trinity']:.2f} s against {s['bare']:.2f} s;" in row


def profile_results() -> list:
    return [RESULTS / "engine-profile-qwen3b.json", RESULTS / "engine-fork0-qwen3b.json"]


def test_the_window_tables_are_the_scripts_output():
    table = profile_table.table(profile_results(), {TRINITY_ARGS: "bare with Trinity's engine arguments"})
    assert table in section()
    labelled = [(profile_results()[0], "serve"), (profile_results()[1], "serve, worker spawned")]
    assert engine_table.table(labelled, ["64", "32"], engine_table.host_session_names()) in section()
    for process, frames in (("VLLM::Worker", WORKER_FRAMES), ("VLLM::EngineCore", CORE_FRAMES)):
        res = json.loads(profile_results()[0].read_text())
        assert stack_frames.table(res, STACKS, frames, "64", process) in section()


def windows() -> tuple[dict, dict, dict]:
    prof, fork0 = (json.loads(p.read_text()) for p in profile_results())
    (bare,) = prof["bare_variants"].values()
    assert " ".join(bare["argv"][3:]).endswith(TRINITY_ARGS)
    return prof["serve"]["levels"], bare["levels"], fork0["serve"]["levels"]


def rate(lv: dict, window: str) -> float:
    return lv[window]["responses_per_s"]


def cpu(lv: dict, window: str, title: str) -> float:
    return next(p["cpu_ms_per_response"] for p in lv[window]["processes"] if p["title"] == title)


def test_the_engine_beside_bare_in_windows():
    serve, bare, fork0 = windows()
    t = text()
    e = {c: rate(serve[c], "engine_numeric") / rate(bare[c], "bare_like_proxy_numeric") for c in ("32", "64")}
    p = {c: rate(serve[c], "proxy") / rate(bare[c], "bare") for c in ("32", "64")}
    assert (f"Trinity's engine served {e['64']:.2f} of bare with Trinity's engine arguments at c=64 and {e['32']:.2f} at "
            f"c=32") in t
    assert f"through the proxy the serve did {p['64']:.2f} / {p['32']:.2f} of that bare's plain requests" in t
    prof = json.loads(profile_results()[0].read_text())
    sw = prof["serve"]["profile"]["window"]
    bw = next(iter(prof["bare_variants"].values()))["profile_numeric"]["window"]
    assert (f"the serve passed {sw['responses_per_s']:.2f} responses/s through the proxy against bare's "
            f"{bw['responses_per_s']:.2f} with the numeric fields ({sw['responses_per_s'] / bw['responses_per_s']:.2f})") in t
    f = {c: rate(fork0[c], "engine_numeric") / rate(serve[c], "engine_numeric") for c in ("32", "64")}
    fp = {c: rate(fork0[c], "proxy") / rate(serve[c], "proxy") for c in ("32", "64")}
    assert (f"{f['64']:.2f} of run 1's engine at c=64 and {f['32']:.2f} at c=32, the proxy {fp['64']:.2f} and "
            f"{fp['32']:.2f}") in t
    assert (f["64"] - 1) * (f["32"] - 1) < 0 and (fp["64"] - 1) * (fp["32"] - 1) < 0  # one way at c=64, the other at c=32
    w_fork0, w = cpu(fork0["64"], "engine_numeric", "VLLM::Worker"), cpu(serve["64"], "engine_numeric", "VLLM::Worker")
    assert f"{w_fork0:.2f} ms against {w:.2f} forked" in t
    eng = {k: lv["64"][win]["engine"] for k, lv, win in (("serve", serve, "engine_numeric"),
                                                         ("bare", bare, "bare_like_proxy_numeric"))}  # fmt: skip
    assert (f"stepped at {eng['serve']['steps_per_s'] / eng['bare']['steps_per_s']:.2f} of bare's rate** at c=64") in t
    assert (f"{eng['serve']['running_mean']:.1f} against {eng['bare']['running_mean']:.1f} requests in the engine on "
            f"average") in t


def test_the_workers_extra_is_waiting():
    serve, bare, _ = windows()
    t = text()
    sw, bw = cpu(serve["64"], "engine_numeric", "VLLM::Worker"), cpu(bare["64"], "bare_like_proxy_numeric", "VLLM::Worker")
    sc, bc = (cpu(serve["64"], "engine_numeric", "VLLM::EngineCore"),
              cpu(bare["64"], "bare_like_proxy_numeric", "VLLM::EngineCore"))  # fmt: skip
    assert f"used {sw:.2f} ms of CPU a response against bare's {bw:.2f} ({sw / bw:.2f}x;" in t
    assert f"the EngineCore {sc:.2f} against {bc:.2f}" in t
    res = json.loads(profile_results()[0].read_text())
    (s, _, ms), (b, _, mb) = stack_frames.rows(res, STACKS, WORKER_FRAMES, "64", "VLLM::Worker")
    assert s == "serve" and b.startswith("bare")
    get, deq, ex, sample = WORKER_FRAMES

    def d(fr: str) -> float:
        return round(ms[fr], 2) - round(mb[fr], 2)  # the table's figures, as the text reads them

    assert d(get) > 0 and d(deq) > 0 and d(ex) + d(sample) < 0
    assert (f"The serve's worker spent {d('*'):.2f} ms a response more than bare's; `get_output` (its output-copy thread "
            f"blocked in `async_copy_ready_event.synchronize()` until the step's GPU work and copy are done) {d(get):.2f} "
            f"more and the wait for the next step's message {d(deq):.2f} more, while its own Python work, the model "
            f"runner's `execute_model` and `sample_tokens`, took {-(d(ex) + d(sample)):.2f} less") in t
    an2 = flat(doc_section("### AN2.", GPU_DOC))
    assert (f"`AsyncGPUModelRunnerOutput.get_output` {ms[get]:.2f} against {mb[get]:.2f} ms a response, "
            f"`MessageQueue.dequeue` {ms[deq]:.2f} against {mb[deq]:.2f}") in an2
    (_, _, cs), (_, _, cb) = stack_frames.rows(res, STACKS, CORE_FRAMES, "64", "VLLM::EngineCore")
    assert f"the EngineCores alike ({cs['*']:.2f} against {cb['*']:.2f} ms)" in an2
    assert abs(cs["*"] - cb["*"]) < 0.1  # "The EngineCore's samples were the same"
    assert (f"`get_output` +{d(get):.2f} ms, the queue +{d(deq):.2f}) while its `execute_model` and `sample_tokens` took "
            f"{-(d(ex) + d(sample)):.2f} ms less") in flat(GPU_DOC.read_text())


def test_the_session_record():
    steps = [(LOGS / f).read_text() for f in ("steps-1.txt", "steps-2.txt", "steps.txt")]
    each = [[ln.split()[2:5] for ln in s.splitlines() if " end " in ln] for s in steps]  # per host_session.sh call
    ran = [tuple(r) for call in each for r in call]
    assert ran == [
        ("proxy3b-spread-direct", "rc=0", "306"), ("proxy3b-abba", "rc=0", "191"), ("engine3b-profile", "rc=0", "337"),
        ("engine3b-fork0", "rc=0", "169"), ("proxy3b-abba-2", "rc=0", "213"), ("ready-3b-late", "rc=0", "163")]
    for s in steps:
        assert "doctor: ok" in s and s.rstrip().endswith("all done")
    assert "the installed rftstack matches /tmp/repo (its package files and 27 patches)" in (LOGS / "go-printed.txt").read_text()
    assert "bundle d22ae0668627: installed 191 wheels" in (LOGS / "install.log").read_text()
    code = "# on the GPU host (tests/gpu/device/: kit.sh here, go.sh there), one machine, in this order:"
    assert code in section()
    for (a, _, sa), (b, _, sb) in each:  # each call's command line in the section, with both steps' seconds
        a, b = a.removesuffix("-2"), b.removesuffix("-2")  # the step's own name on the command line
        assert re.search(rf"host_session\.sh {a} {b} +# {sa} s, {sb} s$", section(), re.M), (a, b)
    assert result(RUNS[2])["label"] == "qwen3b-abba1-2"  # host_session.sh's name for a step run again
    assert "the second proxy3b-abba of one LOGS is written as proxy3b-abba-2, its label qwen3b-abba1-2" in section()
    assert "session AN ran `PY_SPY=/tmp/py-spy bash tests/gpu/host_session.sh engine3b-profile engine3b-fork0`" \
        in flat(README.read_text())
