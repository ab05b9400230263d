"""bench/process_context.py: the processes the serve's engine actor starts (a real Ray head as rftstack serve starts it,
a real actor spawning and forking as vLLM does there) against those `vllm serve` starts, what each inherits and how
fast each runs the same work. The timings themselves go to docs/benchmarks.md, not here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, rftstack_env

sys.path.insert(0, str(REPO / "bench"))
import engine_table  # noqa: E402
import process_context  # noqa: E402

SCRIPT = REPO / "bench" / "process_context.py"


def raylet_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return {int(line.split(None, 1)[0]) for line in out.splitlines() if "/raylet " in line or line.rstrip().endswith("/raylet")}


@pytest.mark.slow
def test_the_engine_actor_s_processes_against_vllm_serve_s(tmp_path):
    before = raylet_pids()
    out = tmp_path / "ctx.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--imports", "json", "--rounds", "1", "--repeats", "1"],
                       capture_output=True, text=True, timeout=600, env=rftstack_env())  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    ctx = res["contexts"]
    assert res["start_methods"] == {"vllm-serve": {"engine": "spawn", "worker": "spawn"},
                                    "ray-actor": {"engine": "spawn", "worker": "fork"},
                                    "ray-actor-spawn": {"engine": "spawn", "worker": "spawn"}}
    ours = ctx["vllm-serve"]["engine"]["context"]
    for name in ("ray-actor", "ray-actor-spawn"):
        for role in ("engine", "worker"):
            c = ctx[name][role]["context"]
            # what Ray gives the processes an actor starts: its workers' niceness, its own interpreter as __main__
            assert c["nice"] == 15 and ours["nice"] < 15
            assert c["python"]["main_module"] == "default_worker.py" and c["python"]["ray_imported"] is True
            assert c["env"]["OMP_NUM_THREADS"] == "1" and c["env"]["RAY_ADDRESS"] == "(set)"  # per run: presence only
            assert {k: c["env"][k] for k in process_context.TRINITY_ACTOR_ENV} == process_context.TRINITY_ACTOR_ENV
    # `vllm serve`'s own processes: spawned under its CLI's start method, this script as __main__, no Ray
    for role in ("engine", "worker"):
        c = ctx["vllm-serve"][role]["context"]
        assert c["python"]["main_module"] == "process_context.py" and c["python"]["ray_imported"] is False
        assert c["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn" and "OMP_NUM_THREADS" not in c["env"]
    # every difference listed, and only differences
    diffs = {(d["context"], d["role"], d["field"]): d for d in res["differences"]}
    assert diffs[("ray-actor", "engine", "nice")]["ray-actor"] == 15
    assert diffs[("ray-actor", "worker", "env.OMP_NUM_THREADS")]["vllm-serve"] == "(unset)"
    assert ("ray-actor", "engine", "env.VLLM_WORKER_MULTIPROC_METHOD") not in diffs  # spawn in both
    assert all(d["vllm-serve"] != d[d["context"]] for d in res["differences"])
    # the workload ran in all six processes, and the ratios are against vllm-serve's own
    for c in process_context.CONTEXTS:
        for role in ("engine", "worker"):
            assert set(res["workload_best"][c][role]) == set(process_context.WORKLOADS)
            assert all(v["wall_ms"] > 0 for v in res["workload_best"][c][role].values())
    assert set(res["ratio_to_vllm_serve"]["vllm-serve"]["worker"].values()) == {1.0}
    assert f"ray-actor engine nice: {ours['nice']!r} -> 15\n" in r.stdout
    assert raylet_pids() <= before, "the benchmark's Ray head is still running"


def test_differences_name_each_field_once_per_role():
    def ctx(nice: int, env: dict, main: str) -> dict:
        return {"context": {"pid": 1, "role": "x", "nice": nice, "env": env, "python": {"main_module": main},
                            "rlimits": {"RLIMIT_NOFILE": ["1024", "4096"]}}}

    pairs = {"vllm-serve": {"engine": ctx(0, {}, "a.py"), "worker": ctx(0, {"A": "1"}, "a.py")},
             "ray-actor": {"engine": ctx(15, {"A": "1"}, "a.py"), "worker": ctx(0, {"A": "2"}, "b.py")}}
    got = {(d["role"], d["field"]): (d["vllm-serve"], d["ray-actor"]) for d in process_context.differences(pairs)}
    assert got == {("engine", "nice"): (0, 15), ("engine", "env.A"): ("(unset)", "1"),
                   ("worker", "env.A"): ("1", "2"), ("worker", "python.main_module"): ("a.py", "b.py")}


def test_bad_contexts_are_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), "--contexts", "ray-actor,docker"],
                       capture_output=True, text=True, timeout=120, env=rftstack_env())  # fmt: skip
    assert r.returncode == 2 and not (tmp_path / "x.json").exists()
    assert r.stderr.strip() == ("process_context: --contexts 'ray-actor,docker': give vllm-serve and any of "
                                "ray-actor, ray-actor-spawn")


def test_trinity_s_actor_variables_are_the_ones_its_engine_actor_sets():
    """TRINITY_ACTOR_ENV against the installed Trinity's vLLMRolloutModel (its literal assignments; the LoRA one only
    with runtime LoRA updating, the bundle indices only with more than one GPU an engine), and host_session.sh's
    TRINITY_ACTOR_ENV (bare's variant) against it: the same less the start method, plus Ray's OMP_NUM_THREADS."""
    import inspect

    from trinity.common.models.vllm_model import vLLMRolloutModel

    src = inspect.getsource(vLLMRolloutModel.__init__)
    literal = dict(re.findall(r'os\.environ\["(\w+)"\] = "([^"]*)"', src))
    expected = {k: v for k, v in process_context.TRINITY_ACTOR_ENV.items() if k != "VLLM_RAY_PER_WORKER_GPUS"}
    assert literal == {**expected, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    assert 'os.environ["VLLM_RAY_PER_WORKER_GPUS"] = str(int(config.use_v1))' in src
    bare = dict(w.split("=", 1) for w in engine_table.host_session_actor_env().split())
    assert bare == {**{k: v for k, v in process_context.TRINITY_ACTOR_ENV.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"},
                    "OMP_NUM_THREADS": "1"}


# where the installed vLLM reads each variable of Trinity's engine actor (vllm/envs.py aside), and why none of those
# places changes an engine of AsyncLLM with the mp executor on one GPU (docs/benchmarks.md, session Z)
VLLM_READERS = {
    "VLLM_USE_V2_MODEL_RUNNER": {"vllm/config/vllm.py", "vllm/v1/engine/input_processor.py"},  # V1 is what Qwen2 gets
    "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE": {"vllm/v1/executor/ray_executor.py"},  # the Ray executor only
    "VLLM_RAY_PER_WORKER_GPUS": {"vllm/v1/executor/ray_executor.py", "vllm/v1/executor/ray_executor_v2.py"},
    # the synchronous LLMEngine, the uni executor, a seed warning, usage statistics, the CPU platform, a benchmark
    "VLLM_ENABLE_V1_MULTIPROCESSING": {"vllm/v1/engine/llm_engine.py", "vllm/v1/executor/uniproc_executor.py",
                                       "vllm/config/parallel.py", "vllm/engine/arg_utils.py", "vllm/usage/usage_lib.py",
                                       "vllm/benchmarks/startup.py", "vllm/platforms/cpu.py"},
    # symmetric-memory all-reduce: more than one GPU an engine
    "VLLM_ALLREDUCE_USE_SYMM_MEM": {"vllm/model_executor/layers/batch_invariant.py",
                                    "vllm/distributed/device_communicators/cuda_communicator.py",
                                    "vllm/distributed/device_communicators/symm_mem.py"},
}


def test_where_vllm_reads_the_variables_trinity_s_engine_actor_sets():
    import vllm

    site = Path(vllm.__file__).resolve().parents[1]
    for var in process_context.TRINITY_ACTOR_ENV:
        if var == "VLLM_WORKER_MULTIPROC_METHOD":
            continue  # `vllm serve` sets the same (test_fork_workers.py)
        readers = {str(p.relative_to(site)) for p in (site / "vllm").rglob("*.py")
                   if p.name != "envs.py" and var in p.read_text(errors="replace")}
        assert readers == VLLM_READERS[var], var


def test_vllm_s_mp_executor_runs_torch_at_one_thread_where_omp_num_threads_is_unset():
    """docs/benchmarks.md (session Z): bare's EngineCore has no OMP_NUM_THREADS, but vLLM's mp executor sets 1 (the
    variable and torch's threads) in it before it starts its worker, so both engines run torch at one thread. The
    installed vLLM's own function, in a process without the variable; and the executor's start calls it."""
    import inspect

    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    assert "set_multiprocessing_worker_envs()" in inspect.getsource(MultiprocExecutor._init_executor)
    code = ("import os, torch\n"
            "torch.set_num_threads(2)\n"
            "from vllm.v1.executor.multiproc_executor import set_multiprocessing_worker_envs\n"
            "set_multiprocessing_worker_envs()\n"
            "print('THREADS', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())\n")
    env = {k: v for k, v in rftstack_env().items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "THREADS 1 1\n" in out.stdout, out.stderr[-3000:]
