"""docs/benchmarks.md's session AC claims (2026-12-05, H100) are what bench/results/gpu-2026-12-05ac/ holds (the serve,
bare and vLLM in a plain Ray actor, engine3b-context; its py-spy stacks) and what bench/results/anyio-root-cpu.json
holds (patches/trinity-engine-anyio-root.patch on this CPU); docs/gpu-results.md says the same."""

from __future__ import annotations

import json

from helpers import REPO
from helpers import doc_section
from helpers import numeric_windows

R = REPO / "bench" / "results" / "gpu-2026-12-05ac"
RUNS = [(R / "engine-context-qwen3b.json", R / "stacks"), (R / "engine-context-qwen3b-r2.json", R / "stacks-r2"),
        (R / "engine-context-qwen3b-r3.json", R / "stacks-r3")]
AB = REPO / "bench" / "results" / "gpu-2026-12-05ab" / "engine-context-qwen3b.json"
CPU = REPO / "bench" / "results" / "anyio-root-cpu.json"
HEADING = "### The serve beside bare and vLLM in a plain Ray actor, and anyio's worker threads"


def section() -> str:
    return doc_section(HEADING)


def text() -> str:
    return " ".join(section().split())


def rng(values: list[float], fmt: str = ".2f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def pair(path) -> tuple[dict, dict]:
    """bare's and the plain actor's numeric window at c=64 (first variant, and the actor without other words)."""
    variants = json.loads(path.read_text())["bare_variants"]
    bare = next(v for k, v in variants.items() if not k.startswith("@") and "OMP_NUM_THREADS" not in k)
    actor = next(v for k, v in variants.items() if k.startswith("@ray-actor --"))
    return bare["levels"]["64"]["bare_like_proxy_numeric"], actor["levels"]["64"]["bare_like_proxy_numeric"]


def test_the_runs_are_the_steps_the_section_names():
    first, r2, r3 = (json.loads(p.read_text()) for p, _ in RUNS)
    assert "serve" in first and len(first["bare_variants"]) == 4 and "--concurrency 32,64 " in first["command"]
    for r in (r2, r3):
        assert "serve" not in r and "--no-serve" in r["command"] and "--concurrency 64 " in r["command"]
        assert [k.split()[0] for k in r["bare_variants"]] == ["--max-num-batched-tokens", "@ray-actor"]
    assert all("--py-spy" in r["command"] for r in (first, r2, r3))
    assert "CONTEXT_NO_PROCESS=1 PY_SPY=/tmp/py-spy bash tests/gpu/host_session.sh cpuinfo engine3b-context" in section()


def test_the_tables_are_the_result_files():
    import engine_table
    import stack_frames

    names = engine_table.host_session_names()
    assert engine_table.table([(RUNS[0][0], "serve")], ["64", "32"], names) in section()
    for i, (path, stacks) in enumerate(RUNS, 1):
        rows = stack_frames.table(json.loads(path.read_text()), stacks).splitlines()[2:]
        for row in rows:
            assert f"| {i} {row}" in section(), row
        b, a = pair(path)
        line = (f"| {i} | {b['responses_per_s']:.1f} | {a['responses_per_s']:.1f} | "
                f"{a['responses_per_s'] / b['responses_per_s']:.2f} | {b['engine']['steps_per_s']:.0f} / "
                f"{a['engine']['steps_per_s']:.0f}, {a['engine']['steps_per_s'] / b['engine']['steps_per_s']:.2f} |")
        assert line in section(), line


def test_the_serve_against_bare_and_the_actor():
    r = json.loads(RUNS[0][0].read_text())
    serve = r["serve"]["levels"]
    eng, bare, env, actor, fork0 = numeric_windows(RUNS[0][0], "64")
    t = text()
    assert (f"served {eng['responses_per_s']:.1f} responses/s at c=64, {eng['responses_per_s'] / bare['responses_per_s']:.2f} "
            f"of bare's {bare['responses_per_s']:.1f} and {eng['responses_per_s'] / actor['responses_per_s']:.2f} of "
            f"`@ray-actor`'s {actor['responses_per_s']:.1f}, at {eng['engine']['steps_per_s']:.0f} engine steps a second "
            f"against {bare['engine']['steps_per_s']:.0f} and {actor['engine']['steps_per_s']:.0f}") in t
    e32, b32, _, a32, _ = numeric_windows(RUNS[0][0], "32")
    assert f"at c=32 {e32['responses_per_s']:.1f}, more than bare's {b32['responses_per_s']:.1f}" in t
    assert e32["responses_per_s"] > b32["responses_per_s"]
    proxy = serve["64"]["proxy"]["responses_per_s"]
    assert f"answered {proxy:.1f} at c=64, {proxy / eng['responses_per_s']:.2f} of its engine" in t
    all64 = [w["responses_per_s"] for w in (eng, bare, env, actor, fork0)]
    assert f"lay within {min(all64):.0f}-{max(all64):.0f} responses/s" in t
    assert f"the actor was the faster ({a32['responses_per_s']:.1f} against {b32['responses_per_s']:.1f})" in t
    assert a32["responses_per_s"] > b32["responses_per_s"]


def test_the_actor_below_bare_at_c64_in_every_pair():
    ratios = [a["responses_per_s"] / b["responses_per_s"] for b, a in (pair(p) for p, _ in RUNS)]
    ab_bare, ab_actor = numeric_windows(AB, "64")
    assert all(x < 1 for x in ratios) and ab_actor["responses_per_s"] < ab_bare["responses_per_s"]
    said = ", ".join(f"{x:.2f}" for x in ratios[:-1]) + f" and {ratios[-1]:.2f} here, " \
        f"{ab_actor['responses_per_s'] / ab_bare['responses_per_s']:.2f} in session AB"
    assert said in text()
    bares = [b["responses_per_s"] for b, _ in (pair(p) for p, _ in RUNS)]
    assert f"bare served {rng(bares, '.0f')} responses/s at c=64 here" in text()


def test_the_frames_ranges_and_the_mechanism():
    import stack_frames

    actorish: dict[str, list[float]] = {f: [] for f in stack_frames.FRAMES}
    bare: dict[str, list[float]] = {f: [] for f in stack_frames.FRAMES}
    for path, stacks in RUNS:
        for name, target, ms in stack_frames.rows(json.loads(path.read_text()), stacks):
            side = bare if target == "*vllm serve" else actorish
            for f in stack_frames.FRAMES:
                side[f].append(ms[f])
    t = text()
    pool, handler, proc = stack_frames.FRAMES
    assert f"`run_in_threadpool`: {rng(actorish[pool])} ms a response in the actor and in the serve, {rng(bare[pool])} in bare" in t
    assert f"({rng(actorish[handler])} against {rng(bare[handler])} ms, and {rng(actorish[proc])} against {rng(bare[proc])} ms)" in t
    assert min(actorish[pool]) > 10 * max(bare[pool])
    for path, stacks in RUNS:  # "two to four times as long ... as bare in the same run", pair by pair
        got = {name: ms for name, _, ms in stack_frames.rows(json.loads(path.read_text()), stacks)}
        for fr in (handler, proc):
            ratio = (got["bare @ray-actor TRINITY_ENGINE_ARGS TRINITY_LIKE_ARGS"][fr]
                     / got["bare TRINITY_ENGINE_ARGS TRINITY_LIKE_ARGS"][fr])
            assert 2 <= ratio <= 4, (path.name, fr, ratio)
    assert "two to four times as long a response in the actor as bare in the same run" in t
    assert "from commit 0a0900c's tree, before the patch below: every server here ran anyio as upstream" in t
    from rftstack.stack import policy

    (patch,) = [p for p in policy.load().patches if p.file == "trinity-engine-anyio-root.patch"]
    why = " ".join(patch.why.split())
    assert f"spent {rng(actorish[pool])} ms of every response in this path" in why
    assert f"where bare `vllm serve` spent {rng(bare[pool])} ms" in why
    # the stacks under it: anyio's root-task scan and a thread started, in the actor's and the serve's frontend
    import gzip
    for stacks, name in ((R / "stacks", "serve-ray-vLLMRolloutModel-c64"), (R / "stacks-r2", None)):
        files = [p for p in stacks.glob("*.collapsed.gz") if (name and name in p.name) or (not name and "VllmServeActor" in p.name)]
        body = gzip.decompress(files[0].read_bytes()).decode()
        under = [ln for ln in body.splitlines() if "run_in_threadpool" in ln]
        assert any("find_root_task" in ln and "all_tasks" in ln for ln in under)
        assert any("Thread.start" in ln for ln in under)


def test_the_patch_on_the_cpu():
    r = json.loads(CPU.read_text())
    t = text()
    ratios = [x["ratio_on_off"] for x in r["rounds"]]
    assert f"answered {r['median_ratio_on_off']:.2f} times the requests a second with the patch (median of three rounds, {rng(ratios)})" in t
    on = [x["on"]["threads"] for x in r["rounds"]]
    off = [x["off"]["threads"] for x in r["rounds"]]
    calls = {x[k]["calls"] for x in r["rounds"] for k in ("on", "off")}
    assert f"with {rng(on, 'd')} worker threads for {calls.pop()} background calls where upstream started {rng(off, 'd')}" in t
    assert not calls and len(r["rounds"]) == 3 and r["concurrency"] == 32 and r["requests"] == 2000
    assert [x["order"] for x in r["rounds"]] == [["on", "off"], ["off", "on"], ["on", "off"]]
    assert "--rounds 3 --requests 2000 --concurrency 32" in section()
    assert "On the GPU host in session AE (`host_session.sh engine3b-anyio`" in t


def test_gpu_results_and_serve_md_say_the_same():
    eng, bare, _, actor, _ = numeric_windows(RUNS[0][0], "64")
    results = " ".join((REPO / "docs" / "gpu-results.md").read_text().split())
    assert (f"Trinity's engine 0.92 of bare ({eng['responses_per_s']:.1f} / {bare['responses_per_s']:.1f} responses/s) "
            f"and 0.96 of `@ray-actor` ({actor['responses_per_s']:.1f})") in results
    assert f"{eng['responses_per_s'] / bare['responses_per_s']:.2f}" == "0.92"
    assert "### AC1. The serve beside bare and vLLM in a plain Ray actor" in results
    assert "2.14 times the requests a second" in results
    assert json.loads(CPU.read_text())["median_ratio_on_off"] == 2.141
    serve_md = " ".join((REPO / "docs" / "serve.md").read_text().split())
    assert "`RFTSTACK_ENGINE_ANYIO_ROOT=0` in the environment of `rftstack serve` restores upstream" in serve_md
