"""docs/benchmarks.md's session Y claims (2026-12-05, CPU) are what the result files in bench/results/cpu-2026-12-05y/
hold: Trinity's proxy served from a Ray actor against the same proxy in a process of its own, and the first run that
the `uv run` hook spoiled."""

from __future__ import annotations

import json

from helpers import REPO
from helpers import doc_section
from helpers import numeric_windows

RUNS = REPO / "bench" / "results" / "cpu-2026-12-05y"
HEADING = "### Trinity's proxy in a Ray actor, as the Explorer serves it"
PLAIN, ACTOR = "sqlite-gc+numeric", "sqlite-gc+numeric+actor"


def section() -> str:
    return " ".join(doc_section(HEADING).split())


def load(name: str) -> dict:
    return json.loads((RUNS / name).read_text())


def test_the_actor_table_is_the_result_files():
    text = section()
    for name, first in (("actor-1.json", PLAIN), ("actor-2.json", ACTOR)):
        r = load(name)
        assert list(r["runs"])[1] == first, name
        s = r["summary"]
        row = (f"| {s[PLAIN]['32']['req_s']:.0f} | {s[ACTOR]['32']['req_s']:.0f} | {s[PLAIN]['64']['req_s']:.0f} | "
               f"{s[ACTOR]['64']['req_s']:.0f} | {s[PLAIN]['cpu_ms_per_response']:.3f} / {s[ACTOR]['cpu_ms_per_response']:.3f} |")
        assert f"`{name}`" in text and row in text, row
        runs = r["runs"]
        assert runs[PLAIN]["proxy_hosting"] == "process" and runs[ACTOR]["proxy_hosting"] == "ray-actor"
        for v in (PLAIN, ACTOR):  # the patched proxy in both, every response recorded, at niceness 0
            answered = sum(lv["ok"] for lv in runs[v]["levels"]) + 8 * len(runs[v]["levels"])
            assert runs[v]["recorded_rows"] == answered and runs[v]["proxy_niceness"] == 0
            assert runs[v]["proxy_fast_forward"] and runs[v]["proxy_gc_tuning"] and runs[v]["proxy_numeric_logprobs"]


def test_the_readings_of_the_actor_runs():
    text = section()
    ratio = {c: [load(n)["summary"][ACTOR][c]["req_s"] / load(n)["summary"][PLAIN][c]["req_s"] for n in ("actor-1.json", "actor-2.json")]
             for c in ("32", "64")}
    said = "kept " + " / ".join(f"{x:.2f}" for x in ratio["32"]) + " of the plain process's rate at c=32 and " + \
        " / ".join(f"{x:.2f}" for x in ratio["64"]) + " at c=64"
    assert said in text, said
    cpu = [load(n)["summary"][v]["cpu_ms_per_response"] for n in ("actor-1.json", "actor-2.json") for v in (PLAIN, ACTOR)]
    assert max(cpu[1] / cpu[0], cpu[0] / cpu[1], cpu[3] / cpu[2], cpu[2] / cpu[3]) < 1.07 and "(within 7 %)" in text


def test_the_run_the_uv_run_hook_spoiled():
    s = load("uvrun-hook.json")["summary"]
    rate = s["hop-gc+actor"]["8"]["req_s"] / s["hop-gc"]["8"]["req_s"]
    cpu = s["hop-gc+actor"]["cpu_ms_per_response"] / s["hop-gc"]["cpu_ms_per_response"]
    assert f"from the actor {rate:.2f} of the process's rate, {cpu:.1f} times its CPU a response" in section()


GPU = REPO / "bench" / "results" / "gpu-2026-12-05y"
GPU_HEADING = "### Where between bare and Trinity's engine the distance lies"
SERVES = {"serve": "engine-bisect-qwen3b.json", "serve, niceness 0": "engine-nice0-qwen3b.json",
          "serve, worker spawned": "engine-fork0-qwen3b.json"}


def gpu_section() -> str:
    return doc_section(GPU_HEADING)


def numeric(name: str, c: str) -> list[dict]:
    """The numeric-fields windows of one file at level c: the serve's engine first, then each bare variant's."""
    return numeric_windows(GPU / name, c)


def test_the_engine_table_is_the_result_files():
    import engine_table

    files = [(GPU / f, label) for label, f in SERVES.items()]
    assert engine_table.table(files, ["64", "32"], engine_table.host_session_names()) in gpu_section()
    bisect = json.loads((GPU / SERVES["serve"]).read_text())
    assert bisect["machine"]["sched_autogroup"] == "1" and bisect["serve"]["engine_stats"] is True
    engine_args, like_args = engine_table.host_session_defaults()  # the two variants: Trinity's batch arguments, then all
    assert list(bisect["bare_variants"]) == [engine_args, f"{engine_args} {like_args}"]


def test_the_readings_of_the_engine_runs():
    text = " ".join(gpu_section().split())
    bare_args, bare_like = numeric(SERVES["serve"], "64")[1:]
    assert f"served {bare_like['responses_per_s'] / bare_args['responses_per_s']:.2f} of bare with the batch arguments alone at c=64" in text
    b32 = numeric(SERVES["serve"], "32")[1:]
    assert f"and {b32[1]['responses_per_s'] / b32[0]['responses_per_s']:.2f} at c=32" in text
    serves64 = [numeric(f, "64")[0] for f in SERVES.values()]
    serves32 = [numeric(f, "32")[0] for f in SERVES.values()]
    rate = sorted(w["responses_per_s"] for w in serves64)
    assert f"served {rate[0]:.0f}-{rate[-1]:.0f} responses/s at c=64 against bare's {min(bare_args['responses_per_s'], bare_like['responses_per_s']):.0f}-{max(bare_args['responses_per_s'], bare_like['responses_per_s']):.0f}" in text
    steps = sorted(w["engine"]["steps_per_s"] for w in serves64)
    bare_steps = sorted(w["engine"]["steps_per_s"] for w in (bare_args, bare_like))
    assert f"took {steps[0]:.0f}-{steps[-1]:.0f} steps a second at c=64 where bare took {bare_steps[0]:.0f}-{bare_steps[-1]:.0f}" in text
    steps32 = sorted(w["engine"]["steps_per_s"] for w in serves32)
    bare32 = sorted(w["engine"]["steps_per_s"] for w in b32)
    assert f"({steps32[0]:.0f}-{steps32[-1]:.0f} steps a second against {bare32[0]:.0f}-{bare32[-1]:.0f})" in text
    import engine_table

    ms = sorted(engine_table.engine_core_ms_per_step(w) for w in serves64)
    bare_ms = sorted(engine_table.engine_core_ms_per_step(w) for w in (bare_args, bare_like))
    assert f"{ms[0]:.1f}-{ms[-1]:.1f} ms of CPU a step against bare's {bare_ms[-1]:.1f}" in text and f"{bare_ms[0]:.1f}" == f"{bare_ms[-1]:.1f}"
    assert f"moved by {100 * (rate[-1] / rate[0] - 1):.0f} %" in text


def test_serve_md_says_what_the_niceness_run_measured():
    """docs/serve.md keeps Ray's niceness as the default because of engine3b-nice0, and cites its numbers."""
    text = " ".join((REPO / "docs" / "serve.md").read_text().split())
    c64 = {label: json.loads((GPU / f).read_text())["serve"]["levels"]["64"] for label, f in SERVES.items()}
    assert json.loads((GPU / SERVES["serve, niceness 0"]).read_text())["machine"]["sched_autogroup"] == "1"

    def rate(label: str, window: str) -> str:
        return f"{c64[label][window]['responses_per_s']:.0f}"
    said = (f"through the proxy {rate('serve, niceness 0', 'proxy')} responses/s against {rate('serve', 'proxy')} and "
            f"{rate('serve, worker spawned', 'proxy')}, its engine directly {rate('serve, niceness 0', 'engine_numeric')} "
            f"against {rate('serve', 'engine_numeric')} and {rate('serve, worker spawned', 'engine_numeric')}")
    assert said in text, said
    nice0 = c64["serve, niceness 0"]
    for window in ("proxy", "engine_numeric"):  # "no faster": at most the better of the two serves at 15, rounded
        assert round(nice0[window]["responses_per_s"]) <= max(round(c64[s][window]["responses_per_s"]) for s in ("serve", "serve, worker spawned"))
