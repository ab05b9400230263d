"""docs/benchmarks.md's session AB claims (2026-12-05, H100) are what bench/results/gpu-2026-12-05ab/ holds: bare
`vllm serve` against vLLM's own server in a plain Ray actor (engine3b-context, its shortest form), their engines'
accounts and the profile window of each; and what vLLM's shared-memory queue does while it waits."""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path

from helpers import REPO
from helpers import doc_section
from helpers import numeric_windows

RUN = REPO / "bench" / "results" / "gpu-2026-12-05ab" / "engine-context-qwen3b.json"
LOGS = REPO / "docs" / "gpu-logs" / "2026-12-05ab"
Y = REPO / "bench" / "results" / "gpu-2026-12-05y"
HEADING = "### vLLM's own server in a plain Ray actor against bare"


def section() -> str:
    return doc_section(HEADING)


def text() -> str:
    return " ".join(section().split())


def variants() -> tuple[dict, dict]:
    bare, actor = json.loads(RUN.read_text())["bare_variants"].values()
    return bare, actor


def test_the_run_is_the_short_form_of_the_context_step():
    r = json.loads(RUN.read_text())
    assert "serve" not in r and "--no-serve" in r["command"] and "--concurrency 64 " in r["command"]
    assert "--py-spy" in r["command"] and "--bare-profile-requests numeric" in r["command"]
    bare, actor = variants()
    assert (bare["launcher"], actor["launcher"]) == ("vllm-serve", "ray-actor") and bare["env"] == actor["env"] == {}
    def args(argv: list[str]) -> list[str]:  # its vLLM arguments, less the port each start was given
        i = argv.index("--port")
        return argv[2:i] + argv[i + 2:]
    assert args(bare["argv"]) == args(actor["argv"]) and actor["argv"][1].endswith("bench/vllm_in_ray.py")
    assert "CONTEXT_NO_SERVE=1 CONTEXT_SHORT=1 CONTEXT_NO_PROCESS=1 CONTEXT_LEVELS=64 PY_SPY=/tmp/py-spy" in section()
    # what the docs say of the actor: uvloop, Ray's niceness 15, no main thread (vllm_in_ray.py's line, in its log)
    with tarfile.open(LOGS / "bare-logs.tgz") as tar:
        logs = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    line = next(ln for name, log in logs.items() if "ray-actor" in name for ln in log.splitlines() if "VLLM_IN_RAY" in ln)
    assert "loop=uvloop.Loop" in line and "niceness=15" in line and "main_thread=False" in line
    assert "(uvloop), at Ray's niceness 15" in text()


def test_the_tables_are_the_result_file():
    import engine_table

    assert engine_table.table([(RUN, RUN.stem)], ["64"], engine_table.host_session_names()) in section()
    bare, actor = variants()
    t = text()
    for key, name in (("bare", "plain"), ("bare_like_proxy", "the fields, logprobs as text"),
                      ("bare_like_proxy_numeric", "the fields, numeric logprobs")):
        x, y = bare["levels"]["64"][key], actor["levels"]["64"][key]
        ratio = y["responses_per_s"] / x["responses_per_s"]
        steps = y["engine"]["steps_per_s"] / x["engine"]["steps_per_s"]
        row = (f"| {name} | {x['responses_per_s']:.1f} | {y['responses_per_s']:.1f} | {ratio:.2f} | "
               f"{x['engine']['steps_per_s']:.0f} / {y['engine']['steps_per_s']:.0f}, {steps:.2f} |")
        assert row in t, row
    num = numeric_windows(RUN, "64")
    fields = [v["levels"]["64"]["bare_like_proxy"] for v in (bare, actor)]
    plain = [v["levels"]["64"]["bare"] for v in (bare, actor)]

    def r(pair: list[dict], key: str = "responses_per_s", sub: str | None = None) -> str:
        a, b = ((w[sub][key] if sub else w[key]) for w in pair)
        return f"{b / a:.2f}"
    assert (f"the actor served {r(num)} of bare, its engine at {r(num, 'steps_per_s', 'engine')} of bare's step rate; "
            f"{r(fields)} with the fields as text, {r(plain)} with plain requests") in t
    running = [w["engine"]["running_mean"] for w in num]
    tokens = [w["engine"]["tokens_per_step"] for w in num]
    assert f"({running[1]:.1f} against {running[0]:.1f} of the 64 clients' on average, {tokens[1]:.1f} against {tokens[0]:.1f} tokens a step)" in t


def test_session_y_s_serves_against_this_distance():
    serves = [numeric_windows(Y / f, "64")[0]["engine"]["steps_per_s"]
              for f in ("engine-bisect-qwen3b.json", "engine-nice0-qwen3b.json", "engine-fork0-qwen3b.json")]
    bares = [w["engine"]["steps_per_s"] for w in numeric_windows(Y / "engine-bisect-qwen3b.json", "64")[1:]]
    assert f"stepped at {min(serves) / max(bares):.2f}-{max(serves) / min(bares):.2f} of bare's rate (H200)" in text()
    bare, actor = (w["engine"]["steps_per_s"] for w in numeric_windows(RUN, "64"))
    assert actor / bare > max(serves) / min(bares)  # "smaller than the serve's distance"


def ms(profile: dict, target: str, frame: str) -> float:
    """ms a response the profile's loop thread of ``target`` spent in ``frame`` (inclusive)."""
    top = profile["targets"][target]["loop_thread"]["top_inclusive_ms_per_response"]
    return next(v for k, v in top.items() if k.split(" (")[0] == frame)


def test_the_profile_readings():
    bare, actor = (v["profile_numeric"] for v in variants())
    t = text()
    w, e = "VLLM::Worker", "VLLM::EngineCore"
    run_b, run_a = ms(bare, w, "Worker.execute_model"), ms(actor, w, "Worker.execute_model")
    assert f"{run_b:.2f}" == f"{run_a:.2f}" and f"spent {run_b:.2f} ms a response in `execute_model` in both" in t
    pairs = {"sample_tokens": (w, "Worker.sample_tokens"), "dequeue_worker": (w, "MessageQueue.dequeue"),
             "dequeue_core": (e, "MessageQueue.dequeue"), "schedule": (e, "Scheduler.schedule"),
             "update": (e, "Scheduler.update_from_output")}
    got = {k: (ms(bare, *v), ms(actor, *v)) for k, v in pairs.items()}
    f = {k: f"{a:.2f} / {b:.2f}" for k, (a, b) in got.items()}
    assert f"and {f['sample_tokens']} ms (bare / `@ray-actor`) in `sample_tokens`" in t
    assert f"the worker {f['dequeue_worker']} ms a response in `MessageQueue.dequeue`" in t
    assert f"the EngineCore {f['dequeue_core']} ms for the worker's output" in t
    assert f"took {f['schedule']} ms (`schedule`) and {f['update']} ms (`update_from_output`)" in t
    assert got["dequeue_worker"][1] > got["dequeue_worker"][0] and got["dequeue_core"][1] > got["dequeue_core"][0]


def test_vllm_s_queue_spins_while_it_waits():
    """The installed vLLM's reader polls its shared-memory queue with sched_yield for a second after its last read."""
    spec = importlib.util.find_spec("vllm")
    assert spec and spec.origin
    src = (Path(spec.origin).parent / "distributed" / "device_communicators" / "shm_broadcast.py").read_text()
    wait = src.split("    def wait(self, timeout_ms", 1)[1].split("\n    def ", 1)[0]
    assert "if current_time <= self.last_read + self.busy_loop_s:\n            sched_yield()" in wait
    assert "busy_loop_s: float = 1," in src and "SpinCondition(\n                is_reader=True, context=context, notify_address" in src
    assert "for a second after its last read" in text()


def test_gpu_results_says_the_same():
    bare, actor = numeric_windows(RUN, "64")
    results = " ".join((REPO / "docs" / "gpu-results.md").read_text().split())
    said = (f"the actor {actor['responses_per_s'] / bare['responses_per_s']:.2f} of bare with the proxy's request "
            f"({actor['responses_per_s']:.1f} / {bare['responses_per_s']:.1f} responses/s)")
    assert said in results and "[AB1](#ab1-vllm-in-a-plain-ray-actor-against-bare)" in results
    assert "### AB1. vLLM in a plain Ray actor against bare" in results


def test_where_the_actor_s_requests_spent_the_rest():
    """The client's latency against vLLM's e2e and scheduled means: each part about 9 ms longer with the actor."""
    t = text()
    w = numeric_windows(RUN, "64")
    lat = [x["latency_s"]["mean"] for x in w]
    e2e = [x["engine"]["mean_s"]["e2e_request_latency"] for x in w]
    sched = [x["engine"]["mean_s"]["request_inference_time"] for x in w]
    assert f"mean latency at the client was {lat[1]:.3f} s with the actor against {lat[0]:.3f} s" in t
    assert f"about a third of the {1000 * (lat[1] - lat[0]):.0f} ms" in t
    assert f"scheduled ({sched[1]:.3f} against {sched[0]:.3f} s)" in t
    front = [1000 * (e - s) for e, s in zip(e2e, sched)]
    back = [1000 * (a - e) for a, e in zip(lat, e2e)]
    assert f"less the scheduled time, {front[1]:.0f} against {front[0]:.0f} ms, before its first step and after its last)" in t
    assert f"client ({back[1]:.0f} against {back[0]:.0f} ms)" in t
    parts = [1000 * (sched[1] - sched[0]), front[1] - front[0], back[1] - back[0]]
    assert all(8 <= x <= 10 for x in parts) and abs(sum(parts) - 1000 * (lat[1] - lat[0])) < 0.5  # "a third" each
    bare, actor = (v["profile_numeric"]["targets"] for v in variants())
    cpu = (bare["*vllm serve"]["loop_thread"]["cpu_ms_per_response"],
           actor["ray::VllmServeActor"]["loop_thread"]["cpu_ms_per_response"])
    assert f"spent about as much CPU a response ({cpu[1]:.2f} against {cpu[0]:.2f} ms)" in t
