"""docs/benchmarks.md's session X claims (2026-12-04, CPU) are what the result files and the installed packages hold:
the niceness table from bench/results/cpu-2026-12-04x/, bare's own account of session W's windows, the worker's wait
in session W's profile, and the model runner Trinity forces against vLLM's default."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from helpers import ENGINE_ARGS_SESSIONS_VW
from helpers import REPO
from helpers import doc_section

NICE = REPO / "bench" / "results" / "cpu-2026-12-04x"
W = REPO / "bench" / "results" / "gpu-2026-12-04w"
HEADING = "### How Trinity runs vLLM, field by field, and the niceness of Ray's workers"


def section() -> str:
    return " ".join(doc_section(HEADING).split())


def cell(summary: dict, variant: str) -> str:
    s = summary[variant]
    if "start_error" in s:
        assert s["start_error"].endswith("did not answer within 120.0 s")
        return "did not answer in 120 s"
    return f"{s['32']['req_s']:.0f} / {s['64']['req_s']:.0f}"


def test_the_niceness_table_is_the_result_files():
    text = section()
    for name, autogroup, busy in (("nice-ag-busy0", "1", 0), ("nice-ag-busy2", "1", 2), ("nice-ag-busy2-rev", "1", 2),
                                  ("nice-noag-busy1", "0", 1), ("nice-noag-busy2", "0", 2), ("nice-noag-busy2-rev", "0", 2)):
        r = json.loads((NICE / f"{name}.json").read_text())
        assert r["machine"]["sched_autogroup"] == autogroup and r["busy_processes"] == busy, name
        row = f"| {cell(r['summary'], 'sqlite-gc')} | {cell(r['summary'], 'sqlite-gc+nice15')} | `{name}.json` |"
        assert row in text, row
        if name.endswith("-rev"):
            assert list(r["runs"]) == ["direct", "sqlite-gc+nice15", "sqlite-gc"], name
    # the proxy's own report of its niceness (the runs since proxy_overhead.py prints it)
    rev = json.loads((NICE / "nice-ag-busy2-rev.json").read_text())["runs"]
    assert rev["sqlite-gc"]["proxy_niceness"] == 0 and rev["sqlite-gc+nice15"]["proxy_niceness"] == 15


def test_the_readings_of_the_niceness_runs():
    def rates(name: str, variant: str) -> list[float]:
        s = json.loads((NICE / f"{name}.json").read_text())["summary"][variant]
        return [s[c]["req_s"] for c in ("32", "64")]
    ratios = [n / z for name in ("nice-ag-busy0", "nice-ag-busy2", "nice-ag-busy2-rev")
              for n, z in zip(rates(name, "sqlite-gc+nice15"), rates(name, "sqlite-gc"))]
    assert f"{min(ratios):.2f}" == "0.77" and f"{max(ratios):.2f}" == "1.07"
    one = [f"{n / z:.2f}" for n, z in zip(rates("nice-noag-busy1", "sqlite-gc+nice15"), rates("nice-noag-busy1", "sqlite-gc"))]
    assert one == ["0.92", "0.89"]
    started = [json.loads((NICE / f"{n}.json").read_text())["runs"]["sqlite-gc"]["proxy_startup_s"] for n in ("nice-noag-busy2", "nice-noag-busy2-rev")]
    assert f"{min(started):.0f}-{max(started):.0f} s" == "26-38 s"
    text = section()
    assert "up to 0.77 and 1.07 of the niceness-0 proxy" in text and "it served 0.92 / 0.89 of the other" in text
    assert "(the niceness-0 one answered after 26-38 s)" in text


def test_bares_own_account_of_session_ws_windows():
    text = section()
    runs = [json.loads((W / n).read_text()) for n in ("engine-args-qwen3b-w.json", "engine-args-qwen3b-w2.json")]
    bare = [r["bare_variants"][ENGINE_ARGS_SESSIONS_VW]["levels"]["64"]["bare_like_proxy_numeric"] for r in runs]
    serve = [r["serve"]["levels"]["64"]["engine_numeric"] for r in runs]
    eng = [b["engine"] for b in bare]
    assert f"{eng[0]['steps_per_s']:.1f} / {eng[1]['steps_per_s']:.1f} engine steps" in text
    assert f"{eng[0]['running_mean']:.1f} / {eng[1]['running_mean']:.1f} of the 64 requests running" in text
    e2e = " / ".join(f"{e['mean_s']['e2e_request_latency']:.3f}" for e in eng)
    inf = " / ".join(f"{e['mean_s']['request_inference_time']:.3f}" for e in eng)
    assert f"per request {e2e} s from its arrival in the frontend to its end, {inf} s of it scheduled" in text
    assert all(e["running_mean"] < 64 * 0.6 for e in eng)  # "about a third ... outside the running batch"
    p50 = lambda ws: " / ".join(f"{w['latency_s']['p50']:.3f}" for w in ws)  # noqa: E731
    assert f"The serve's clients waited {p50(serve)} s a request (p50) where bare's waited {p50(bare)} s" in text


def test_the_workers_wait_in_session_ws_profile():
    ph = json.loads((W / "fields-profile-qwen3b.json").read_text())["bare_variants"][ENGINE_ARGS_SESSIONS_VW]
    loop = ph["profile_numeric"]["targets"]["VLLM::Worker"]["loop_thread"]
    deq = next(v for k, v in loop["top_inclusive_ms_per_response"].items() if k.startswith("MessageQueue.dequeue "))
    assert f"spent {deq:.2f} of its {loop['cpu_ms_per_response']:.2f} ms a response in `MessageQueue.dequeue`" in section()


def test_trinity_forces_the_v1_model_runner_which_vllm_picks_for_qwen2_only_among_these():
    from vllm.config.vllm import DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES as v2

    src = Path(importlib.util.find_spec("trinity.common.models.vllm_model").origin).read_text()
    assert 'if self.vllm_version >= parse_version("0.22.0"):\n            # Force vLLM to use V1 for now\n' \
           '            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"' in src
    assert "Qwen2ForCausalLM" not in v2
    assert {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"} <= v2
    assert "for Llama, Mistral and Qwen3 architectures bare vLLM picks the V2 model runner" in section()


def test_the_ray_default_named_is_rftstacks():
    from rftstack.run import niceness

    assert niceness.RAY_DEFAULT == 15 and "at niceness 15, and a process an actor forks" in section()
