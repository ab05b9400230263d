"""docs/benchmarks.md's session AE claims (2026-12-06, H100) are what bench/results/gpu-2026-12-06ae/ holds: the serve
with patches/trinity-engine-anyio-root.patch off, then on beside bare (host_session.sh engine3b-anyio, py-spy windows),
and bench/anyio_root.py on the host's CPU (anyiocpu); docs/gpu-results.md and docs/serve.md say the same."""

from __future__ import annotations

import json
import statistics

from helpers import REPO
from helpers import doc_section
from helpers import numeric_windows

R = REPO / "bench" / "results" / "gpu-2026-12-06ae"
OFF, ON, CPU = R / "engine-anyio0-qwen3b.json", R / "engine-anyio-qwen3b.json", R / "anyio-root-host.json"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-06ae"
HEADING = "### The anyio patch under load, beside bare (session AE"
HANDLER = "AsyncLLM._run_output_handler.<locals>.output_handler (vllm/v1/engine/async_llm.py)"
POOL = "run_in_threadpool (starlette/concurrency.py)"
MIDDLEWARE = "PrometheusInstrumentatorMiddleware.__call__ (prometheus_fastapi_instrumentator/middleware.py)"


def text() -> str:
    return " ".join(doc_section(HEADING).split())


def load(path) -> dict:
    return json.loads(path.read_text())


def loops() -> dict[str, dict]:
    """The engine's server loop thread in each profile window: the serve's actor (off, on) and bare's `vllm serve`."""
    bare = next(iter(load(ON)["bare_variants"].values()))["profile_numeric"]["targets"]["*vllm serve"]
    return {"off": load(OFF)["serve"]["profile"]["targets"]["ray::vLLMRolloutModel"]["loop_thread"],
            "on": load(ON)["serve"]["profile"]["targets"]["ray::vLLMRolloutModel"]["loop_thread"],
            "bare": bare["loop_thread"]}


def test_the_runs_are_the_step_the_section_names():
    off, on = load(OFF), load(ON)
    assert "--py-spy" in off["command"] and "bare_variants" not in off
    assert "--bare" in on["command"] and len(on["bare_variants"]) == 1 and "--bare-profile-requests numeric" in on["command"]
    for r in (off, on):
        assert "--concurrency 32,64 --window-s 12" in r["command"] and "--numeric" in r["command"]
    steps = (LOGS / "steps.txt").read_text()
    for step in ("engine3b-anyio rc=0", "java rc=0", "anyiocpu rc=0"):
        assert step in steps
    assert "PY_SPY=/tmp/py-spy bash tests/gpu/host_session.sh cpuinfo engine3b-anyio java" in doc_section(HEADING)
    # host_session.sh's engine3b-anyio: the first serve upstream (the patch off), the second with the defaults
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        engine3b-anyio) ", 1)[1].split(";;", 1)[0]
    first, second = step.split("engine-anyio0-qwen3b.json", 1)
    assert "RFTSTACK_ENGINE_ANYIO_ROOT=0" in first and "RFTSTACK_ENGINE_ANYIO_ROOT" not in second


def test_the_engine_table_is_the_result_files():
    import engine_table

    names = engine_table.host_session_names()
    table = engine_table.table([(OFF, "serve, patch off"), (ON, "serve, patch on")], ["64", "32"], names)
    assert table in doc_section(HEADING)


def test_the_frames_table_and_the_reading():
    import stack_frames

    lp = loops()
    top = {k: v["top_inclusive_ms_per_response"] for k, v in lp.items()}
    sec = doc_section(HEADING)
    assert (f"| vLLM's output handler (`AsyncLLM._run_output_handler`) | {top['off'][HANDLER]} | {top['on'][HANDLER]} | "
            f"{top['bare'][HANDLER]} |") in sec
    assert (f"| Starlette's middleware (`PrometheusInstrumentatorMiddleware.__call__`) | {top['off'][MIDDLEWARE]} | "
            f"{top['on'][MIDDLEWARE]} | {top['bare'][MIDDLEWARE]} |") in sec
    assert (f"| the whole loop thread | {lp['off']['cpu_ms_per_response']} | {lp['on']['cpu_ms_per_response']} | "
            f"{lp['bare']['cpu_ms_per_response']} |") in sec
    # anyio's path: among the unpatched loop's largest frames; not among the patched one's nor bare's, whose stacks
    # (the patched serve's and bare's, kept in stacks/) hold it for a hundredth or two of a ms
    assert POOL in top["off"] and POOL not in top["on"] and POOL not in top["bare"]
    rows = {name: ms for name, _, ms in stack_frames.rows(load(ON), R / "stacks")}
    pool_on, pool_bare = rows["serve"]["run_in_threadpool"], rows["bare TRINITY_ENGINE_ARGS TRINITY_LIKE_ARGS"]["run_in_threadpool"]
    assert f"| anyio's worker-thread path (`run_in_threadpool`) | {top['off'][POOL]} | {pool_on:.2f} (its stacks) | {pool_bare:.2f} (its stacks) |" in sec
    assert pool_on < top["off"][POOL] / 10
    t = text()
    assert (f"its output handler {top['off'][HANDLER]} ms a response without the patch, {top['on'][HANDLER]} with it, "
            f"bare {top['bare'][HANDLER]}") in t
    assert top["on"][HANDLER] <= top["bare"][HANDLER] < top["off"][HANDLER] / 2
    assert (f"The loop thread's samples in all did not fall ({lp['off']['cpu_ms_per_response']} against "
            f"{lp['on']['cpu_ms_per_response']} ms)") in t
    assert lp["on"]["cpu_ms_per_response"] >= 0.9 * lp["off"]["cpu_ms_per_response"]


def test_the_engine_and_the_proxy_against_bare():
    t = text()
    (off64,), (on64, bare64) = numeric_windows(OFF, "64"), numeric_windows(ON, "64")
    (off32,), (on32, bare32) = numeric_windows(OFF, "32"), numeric_windows(ON, "32")
    rps = {k: w["responses_per_s"] for k, w in (("off64", off64), ("on64", on64), ("b64", bare64), ("off32", off32),
                                                ("on32", on32), ("b32", bare32))}
    assert (f"0.97 of bare without the patch, 1.03 with it at c=64** ({rps['off64']:.1f} and {rps['on64']:.1f} "
            f"against {rps['b64']:.1f} responses/s") in t
    assert f"{rps['off64'] / rps['b64']:.2f} {rps['on64'] / rps['b64']:.2f}" == "0.97 1.03"
    assert (f"at c=32 {rps['off32'] / rps['b32']:.2f} and {rps['on32'] / rps['b32']:.2f} ({rps['off32']:.1f}, "
            f"{rps['on32']:.1f} against {rps['b32']:.1f})") in t
    steps = [w["engine"]["steps_per_s"] for w in (off64, on64, bare64)]
    assert f"at {min(steps):.0f}-{max(steps):.0f} engine steps a second each" in t
    proxy = {c: [load(p)["serve"]["levels"][c]["proxy"]["responses_per_s"] for p in (OFF, ON)] for c in ("64", "32")}
    bare = {c: next(iter(load(ON)["bare_variants"].values()))["levels"][c] for c in ("64", "32")}
    assert (f"{proxy['64'][0]:.1f} responses/s at c=64 without the patch, {proxy['64'][1]:.1f} with it, where bare "
            f"answered {bare['64']['bare']['responses_per_s']:.1f} to the plain request and "
            f"{bare['64']['bare_like_proxy_numeric']['responses_per_s']:.1f} to the proxy's") in t
    assert (f"at c=32 {proxy['32'][0]:.1f} and {proxy['32'][1]:.1f} against bare's {bare['32']['bare']['responses_per_s']:.1f} "
            f"and {bare['32']['bare_like_proxy_numeric']['responses_per_s']:.1f}") in t
    assert abs(proxy["64"][1] - proxy["64"][0]) / proxy["64"][0] < 0.02  # "did not move"
    assert f"the proxy {proxy['32'][1] / bare['32']['bare_like_proxy_numeric']['responses_per_s']:.2f} of bare with the same request" in t


def test_the_java_agent_with_the_patch_on():
    log = (LOGS / "java.log").read_text()
    agent = json.loads(next(ln for ln in log.splitlines() if ln.startswith('{"wall_s"')))
    rows = json.loads(next(ln for ln in log.splitlines() if ln.startswith('{"proxy_history_rows"')))
    assert agent["requests_ok"] == 56 and agent["requests_failed"] == 0 and agent["agents"] == 8
    assert agent["http"] == "default (HTTP_2)" and rows == {"proxy_history_rows": 40, "committed_rows": 40}
    assert "1 passed" in log
    assert "8 agents with the default `HttpClient`, 56 of 56 requests, 40 of 40 responses in `proxy_history` and committed" in text()


def test_the_cpu_bench_on_the_host():
    r = load(CPU)
    assert r["machine"]["cpus"] == 16 and r["requests"] == 2000 and r["concurrency"] == 32 and len(r["rounds"]) == 6

    def med(n, k):
        return statistics.median(x[n][k] for x in r["rounds"])

    def rng(n, k):
        v = [x[n][k] for x in r["rounds"]]
        return f"{min(v)}-{max(v)}"

    t = text()
    assert (f"loop thread {med('on', 'loop_thread_ms_per_request'):.2f} ms CPU a request with the patch, "
            f"{med('plain', 'loop_thread_ms_per_request'):.2f} in a plain process, "
            f"{med('off', 'loop_thread_ms_per_request'):.2f} in the actor without it") in t
    assert (f"{rng('on', 'threads')} worker threads for 2001 background calls with it, {rng('plain', 'threads')} in the "
            f"plain process, {rng('off', 'threads')} without") in t
    ratios = [x["ratio_on_off"] for x in r["rounds"]]
    assert (f"requests/s on / off {r['median_ratio_on_off']:.2f} ({min(ratios):.2f}-{max(ratios):.2f}), on / plain "
            f"{r['median_ratio_on_plain']:.2f}, off / plain {r['median_ratio_off_plain']:.2f}") in t


def test_gpu_results_and_serve_md_say_the_same():
    (off64,), (on64, bare64) = numeric_windows(OFF, "64"), numeric_windows(ON, "64")
    top = {k: v["top_inclusive_ms_per_response"][HANDLER] for k, v in loops().items()}
    results = " ".join((REPO / "docs" / "gpu-results.md").read_text().split())
    assert "### AE1. The anyio patch under load" in results
    assert (f"Trinity's engine reached directly 0.97 of bare without the patch, 1.03 with it "
            f"({off64['responses_per_s']:.1f} / {on64['responses_per_s']:.1f} against {bare64['responses_per_s']:.1f} "
            f"responses/s); vLLM's output handler in the engine's actor {top['off']} ms a response without, "
            f"{top['on']} with, bare {top['bare']}") in results
    serve_md = " ".join((REPO / "docs" / "serve.md").read_text().split())
    assert (f"vLLM's output handler in the engine's actor {top['off']} ms a response without the patch and {top['on']} "
            f"with it, bare `vllm serve`'s {top['bare']}, and the engine reached directly {off64['responses_per_s']:.1f} "
            f"and {on64['responses_per_s']:.1f} responses/s at c=64 against bare's {bare64['responses_per_s']:.1f}") in serve_md
