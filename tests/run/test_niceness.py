"""The niceness of a node's Ray workers (rftstack.run.niceness; serve, ray-head and ray-worker's --worker-niceness):
real Ray heads started as rftstack starts them, a real actor reporting its own niceness and that of a process it
forks (as Trinity's engine actor forks vLLM's EngineCore and worker), the real serve runner with Trinity's TEST
DOUBLE (fake_trinity.py: no GPU here), the real CLIs for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rftstack.errors import UserError
from rftstack.run import niceness
from rftstack.run import ray_head
from rftstack.run import supervisor

from helpers import rftstack_env

DRIVER = textwrap.dedent("""
    import json, multiprocessing as mp, os
    import ray
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)

    def child(q):
        q.put(os.getpriority(os.PRIO_PROCESS, 0))

    @ray.remote
    class Engine:
        async def niceness(self):
            ctx = mp.get_context("fork")  # niceness passes to a forked (and so to a spawned) child: vLLM spawns its EngineCore
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            forked = q.get(timeout=60)
            p.join()
            return {"actor": os.getpriority(os.PRIO_PROCESS, 0), "forked": forked}

    print("REPORT " + json.dumps(ray.get(Engine.remote().niceness.remote())), flush=True)
""")


def actor_niceness(tmp_path: Path, extra_env: dict[str, str]) -> dict:
    head = ray_head.start(state_dir=tmp_path / "head", num_gpus=0, num_cpus=2, env={**os.environ, **extra_env}, dashboard=False)
    try:
        out = subprocess.run([sys.executable, "-c", DRIVER], env=ray_head.driver_env(head), capture_output=True, text=True, timeout=180)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")]
        assert lines, out.stderr[-3000:]
        return json.loads(lines[0][len("REPORT "):])
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)


def test_ray_runs_actors_and_what_they_fork_at_15_unless_told(tmp_path):
    """Ray's default, which the serve's engine and proxy inherit as upstream; and the asked niceness instead."""
    shell = os.getpriority(os.PRIO_PROCESS, 0)
    assert shell < niceness.RAY_DEFAULT
    assert actor_niceness(tmp_path / "default", niceness.head_env(None)) == {"actor": niceness.RAY_DEFAULT, "forked": niceness.RAY_DEFAULT}
    assert actor_niceness(tmp_path / "asked", niceness.head_env(max(shell, 0))) == {"actor": max(shell, 0), "forked": max(shell, 0)}


def test_asked_values():
    assert niceness.asked(None, {}) is None and niceness.effective(None) == niceness.RAY_DEFAULT
    assert niceness.asked("0", {niceness.DEFAULT_VAR: "7"}) == 0
    assert niceness.asked(None, {niceness.DEFAULT_VAR: " 7 "}) == 7 and niceness.head_env(7) == {"RAY_worker_niceness": "7"}
    assert niceness.asked(None, {niceness.DEFAULT_VAR: ""}) is None and niceness.head_env(None) == {}
    for flag, env, says in (("20", {}, "--worker-niceness 20: give"), ("-1", {}, "--worker-niceness -1: give"),
                            ("low", {}, "--worker-niceness low: give"), (None, {niceness.DEFAULT_VAR: "x"}, "RFTSTACK_WORKER_NICENESS='x': give")):
        with pytest.raises(UserError, match="whole number from 0") as info:
            niceness.asked(flag, env)
        assert str(info.value).startswith(says)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def raylet_env(tag: str) -> dict[str, str]:
    (raylet,) = [p for p in supervisor.tagged(tag) if p.cmdline.split(" ")[0].endswith("/raylet")]
    return environ_of(raylet.pid)


def test_serve_starts_its_head_with_the_asked_niceness(tmp_path, serve_runner):
    """--worker-niceness 0: the own head's raylet gets Ray's variable, the status and the progress say so;
    without it (RFTSTACK_WORKER_NICENESS unset) the head is left at Ray's 15, said too."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\ncluster: {node_num: 1, gpu_per_node: 1}\n")
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "--warm-workers", "0", "--worker-niceness", "0",
                        "-c", str(cfg)], fake="check_ray")  # fmt: skip
    assert run.wait_event("ready", timeout=400), (run.finish(), run.stderr)
    st = run.status()
    assert st["ray"]["worker_niceness"] == 0 and raylet_env(st["ray"]["tag"])["RAY_worker_niceness"] == "0"
    # `ray start` runs in a session of its own (so, with the kernel's autogroup on, its workers share the CPUs with other
    # sessions as one group, whatever their niceness: docs/benchmarks.md, session X)
    (raylet,) = [p for p in supervisor.tagged(st["ray"]["tag"]) if p.cmdline.split(" ")[0].endswith("/raylet")]
    assert os.getsid(raylet.pid) not in (os.getsid(0), os.getsid(run.proc.pid))
    assert "Ray workers (the proxy, the engines and what they fork) run at niceness 0\n" in run.stderr_text()
    run.kill()

    default = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "--warm-workers", "0", "-c", str(cfg)],
                           fake="check_ray", RFTSTACK_WORKER_NICENESS="")  # fmt: skip
    assert default.wait_event("ready", timeout=400), (default.finish(), default.stderr)
    st = default.status()
    assert st["ray"]["worker_niceness"] == 15 and "RAY_worker_niceness" not in raylet_env(st["ray"]["tag"])
    assert "run at niceness 15 (Ray's default; --worker-niceness 0: as `vllm serve` from the shell)" in default.stderr_text()
    default.kill()


def test_bad_niceness_is_one_sentence_and_starts_nothing(tmp_path, serve_runner):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\n")
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "--worker-niceness", "20", "-c", str(cfg)])
    assert run.finish(timeout=60) == 2
    assert "--worker-niceness 20: give the niceness of the node's Ray workers as a whole number from 0" in run.stderr
    assert "Traceback" not in run.stderr and run.status()["phase"] == "failed"
    assert all(supervisor.tagged(tag) == [] for tag in run.tags())
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "-c", str(cfg)], RFTSTACK_WORKER_NICENESS="high")
    assert run.finish(timeout=60) == 2 and "RFTSTACK_WORKER_NICENESS='high': give the niceness" in run.stderr
    run = serve_runner(["--skip-doctor", "--worker-niceness", "0", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent",
                        "-c", str(cfg)])  # fmt: skip
    assert run.finish(timeout=60) == 2
    assert "--worker-niceness sets the niceness of the workers of this serve's own Ray head; leave out --ray-address" in run.stderr


@pytest.mark.parametrize("command", ["ray-head", "ray-worker"])
def test_ray_node_commands_refuse_a_bad_niceness(tmp_path, command):
    out = subprocess.run([sys.executable, "-m", "rftstack", command, "--state-dir", str(tmp_path / "state"), "--worker-niceness", "99",
                          *(["--address", "127.0.0.1:1"] if command == "ray-worker" else [])],
                         capture_output=True, text=True, timeout=120, env=rftstack_env())  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"rftstack {command}: --worker-niceness 99: give the niceness of the node's Ray workers as a whole number from 0 (the "
        "shell's, as `vllm serve`) to 19 (unset: Ray's 15)"]
    assert not (tmp_path / "state" / ("head.json" if command == "ray-head" else "worker.json")).exists()


def test_ray_head_starts_its_node_with_the_asked_niceness(tmp_path):
    state = tmp_path / "state"
    env = rftstack_env()
    out = subprocess.run([sys.executable, "-m", "rftstack", "ray-head", "--state-dir", str(state), "--num-gpus", "0", "--num-cpus", "1",
                          "--worker-niceness", "3", "--json"], capture_output=True, text=True, timeout=240, env=env)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr[-3000:]
        info = json.loads(out.stdout.strip().splitlines()[-1])
        assert info["worker_niceness"] == 3 and raylet_env(info["tag"])["RAY_worker_niceness"] == "3"
    finally:
        stop = subprocess.run([sys.executable, "-m", "rftstack", "ray-head", "stop", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert stop.returncode == 0, stop.stderr[-2000:]
