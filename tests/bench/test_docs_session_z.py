"""docs/benchmarks.md's session Z claims (2026-12-05, CPU) are what bench/results/cpu-2026-12-05z/ holds: what the
processes Trinity's engine actor starts inherit beside `vllm serve`'s, and the same workload's time in each."""

from __future__ import annotations

import json

from helpers import REPO
from helpers import doc_section

RUNS = REPO / "bench" / "results" / "cpu-2026-12-05z"
HEADING = "### What the engine actor's processes inherit, and `vllm serve` spawns too"
FILES = ("context-1.json", "context-2.json")


def section() -> str:
    return " ".join(doc_section(HEADING).split())


def load(name: str) -> dict:
    return json.loads((RUNS / name).read_text())


def test_both_runs_are_the_commands_in_the_section_in_both_orders():
    text = section()
    one, two = load(FILES[0]), load(FILES[1])
    assert list(one["contexts"]) == ["vllm-serve", "ray-actor", "ray-actor-spawn"]
    assert list(two["contexts"]) == ["ray-actor-spawn", "ray-actor", "vllm-serve"]
    for r in (one, two):
        assert r["imports"] == ["vllm.entrypoints.openai.api_server"] and "--repeats" not in r["command"]
        assert all(len(rounds) == 3 for rounds in r["rounds"].values())  # 3 turns of 5 repeats: best of 15
        assert r["start_methods"]["vllm-serve"] == {"engine": "spawn", "worker": "spawn"}
        assert r["start_methods"]["ray-actor"] == {"engine": "spawn", "worker": "fork"}
    assert "best of 15 a process" in text
    assert "python bench/process_context.py --contexts ray-actor-spawn,ray-actor,vllm-serve" in text


def test_the_workload_ratios():
    ratios = [v for name in FILES for c, roles in load(name)["ratio_to_vllm_serve"].items() if c != "vllm-serve"
              for r in roles.values() for v in r.values()]
    assert len(ratios) == 2 * 2 * 2 * 3
    assert f"**{min(ratios):.2f}-{max(ratios):.2f}**" in section()


def test_the_differences_table_and_what_is_equal():
    text = section()
    for name in FILES:
        r = load(name)
        for ctx in ("ray-actor", "ray-actor-spawn"):
            for role in ("engine", "worker"):
                diff = {d["field"]: (d["vllm-serve"], d[ctx]) for d in r["differences"] if d["context"] == ctx and d["role"] == role}
                assert diff["nice"] == (0, 15)
                assert diff["env.OMP_NUM_THREADS"] == ("(unset)", "1")
                assert diff["python.main_module"][1] == "default_worker.py" and diff["python.ray_imported"] == (False, True)
                assert diff["stdio.stdout"][1] == diff["stdio.stderr"][1] == "pipe"
                assert diff["env.PYTHONBREAKPOINT"] == ("(unset)", "ray.util.rpdb.set_trace")
                for var in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE",
                            "VLLM_RAY_PER_WORKER_GPUS", "VLLM_ALLREDUCE_USE_SYMM_MEM"):
                    value = diff[f"env.{var}"][1]
                    assert diff[f"env.{var}"][0] == "(unset)" and f"`{var}={value}`" in text
                assert "env.VLLM_WORKER_MULTIPROC_METHOD" not in diff  # spawn in both
                modules = diff["python.modules"][1] - diff["python.modules"][0]
                objects = diff["python.gc_objects"][1] / diff["python.gc_objects"][0] - 1
                assert 150 <= modules <= 250 and 0.01 <= objects <= 0.03  # "about 200 modules and 2 % more objects"
                # what the section says is equal in all three
                equal = ("cpus_allowed", "sched_policy", "timerslack_ns", "rlimits", "cgroup", "preloaded_allocators",
                         "python.switchinterval_s", "python.gc_threshold", "python.gc_frozen", "python.trace",
                         "python.profile", "python.gc_enabled")
                assert not [f for f in diff if f in equal or f.startswith("python.flags") or f.startswith("python.monitoring")]
            engine = r["contexts"][ctx]["engine"]["context"]
            assert engine["env"]["RAY_LD_PRELOAD_ON_WORKERS"] == "0" and engine["preloaded_allocators"] == []
    assert "`RAY_LD_PRELOAD_ON_WORKERS=0`" in text and "| niceness | the shell's (0) | Ray's 15" in text
