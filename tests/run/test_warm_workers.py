"""Warm Ray workers for serve's own head (rftstack.run.warm_workers, patches/ray-prestart-workers.patch,
patches/trinity-launcher-head-env.patch): real Ray heads, the real patched Ray and Trinity launcher,
Trinity's own config code for the variables; the modules preloaded here are small ones of the test's
(the real list imports torch and vLLM, 15-20 s per process on a 2-core machine: that it is importable
is checked, the time it saves is measured on the GPU host by bench/serve_vs_bare.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rftstack.doctor.checks import config as config_check
from rftstack.run import ray_head
from rftstack.run import serve_config
from rftstack.run import supervisor
from rftstack.run import warm_workers

import trinity.cli.launcher as launcher


def raylet_pid(head: ray_head.Head) -> int:
    (pid,) = [p.pid for p in head.processes() if p.cmdline.split(" ")[0].endswith("/raylet")]
    return pid


def idle_workers(head: ray_head.Head) -> list[int]:
    """Pids of the raylet's Python workers that hold no task (Ray titles them ``ray::IDLE``)."""
    out = subprocess.run(["ps", "--ppid", str(raylet_pid(head)), "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if line.split()[1:2] == ["ray::IDLE"]]


def test_the_preloaded_modules_exist_and_name_the_actor_classes_of_a_serve():
    for name in warm_workers.PRELOAD:
        assert importlib.util.find_spec(name) is not None, name
    classes = {"trinity.explorer.explorer": "Explorer", "trinity.explorer.rollout_coordinator": "RolloutCoordinator",
               "trinity.common.models.vllm_model": "vLLMRolloutModel", "trinity.manager.synchronizer": "Synchronizer"}  # fmt: skip
    for module, cls in classes.items():
        assert module in warm_workers.PRELOAD
        src = Path(importlib.util.find_spec(module).origin).read_text()
        assert f"class {cls}" in src, (module, cls)


def test_actor_count_follows_the_engines():
    assert warm_workers.actor_count({}) == 5
    assert warm_workers.actor_count({"explorer": {"rollout_model": {"engine_num": 2}}}) == 6
    aux = {"explorer": {"rollout_model": {"engine_num": 1}, "auxiliary_models": [{"engine_num": 2}, {}]}}
    assert warm_workers.actor_count(aux) == 8


@pytest.mark.parametrize("extra", [
    {},
    {"checkpoint_root_dir": "relative/ckpt", "project": "p", "group": "g", "name": "n",
     "log": {"level": "DEBUG", "group_by_node": True}},
])  # fmt: skip
def test_trinity_env_is_what_trinitys_own_config_gives(tmp_path, tiny_model, extra, monkeypatch):
    """What the head is started with equals `config.get_envs()` after Trinity's own config check
    (the doctor's probe: real Trinity code, run in the serve's working directory)."""
    user = {**serve_config.default_config(str(tiny_model), gpus=1), **extra}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg, _ = serve_config.effective(user, run_dir=str(run_dir), ray_address="auto", proxy_port=8010, expose=False, model_max_len=None)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    monkeypatch.setenv("TRINITY_PLUGIN_DIRS", str(tmp_path / "plugins"))
    probe = config_check.Probe(str(path), 1, cwd=str(run_dir))
    got = probe.result()
    probe.cancel()
    assert got.get("envs"), got
    assert warm_workers.trinity_env(cfg, cwd=str(run_dir), environ=dict(os.environ)) == got["envs"]


def test_launcher_patch_warns_in_trinitys_log_on_a_difference():
    code = ("import trinity.cli.launcher as l; "
            "print('RESULT', l.job_runtime_env({'TRINITY_LOG_DIR': '/x'}, environ={l.HEAD_ENV_VAR: '{\"TRINITY_LOG_DIR\": \"/y\"}'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "RESULT {'env_vars': {'TRINITY_LOG_DIR': '/x'}}" in out.stdout, out.stderr[-2000:]
    assert "WARNING" in out.stdout and "the Ray head's TRINITY_LOG_DIR differ from this config's" in out.stdout


def test_launcher_patch_decides_the_jobs_runtime_env():
    envs = {"TRINITY_LOG_DIR": "/x/log", "TRINITY_LOG_LEVEL": "INFO"}
    assert launcher.job_runtime_env(envs, environ={}) == {"env_vars": envs}  # upstream
    same = warm_workers.driver_env(envs)
    assert launcher.job_runtime_env(envs, environ=same) is None
    other = warm_workers.driver_env({**envs, "TRINITY_LOG_DIR": "/y/log"})
    assert launcher.job_runtime_env(envs, environ=other) == {"env_vars": envs}
    with pytest.raises(ValueError, match="must be a JSON object"):
        launcher.job_runtime_env(envs, environ={launcher.HEAD_ENV_VAR: "[1]"})
    assert launcher.HEAD_ENV_VAR == warm_workers.HEAD_ENV_VAR


@pytest.fixture
def probe_module(tmp_path):
    """A module for the head to preload that notes when it was imported (the stand-in for
    Trinity's modules, which take 15-20 s to import here)."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "warm_probe_mod.py").write_text("import time\nIMPORTED_AT = time.time()\n")
    return mods


DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import ray
    import trinity.cli.launcher as launcher
    envs = json.loads(sys.argv[1])
    ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=launcher.job_runtime_env(envs), log_to_driver=False)
    connected = time.time()

    @ray.remote
    class Probe:
        def report(self):
            mod = sys.modules.get("warm_probe_mod")
            ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
            uptime = float(open("/proc/uptime").read().split()[0])
            return {"pid": os.getpid(), "log_dir": os.environ.get("TRINITY_LOG_DIR"),
                    "preloaded_at": getattr(mod, "IMPORTED_AT", None),
                    "process_started": time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")}

    print("REPORT " + json.dumps({"connected": connected, **ray.get(Probe.remote().report.remote())}), flush=True)
""")


def start_head(tmp_path, probe_module, trinity: dict, workers: int) -> ray_head.Head:
    env = {**os.environ, **warm_workers.head_env(trinity, workers),
           "RAY_preload_python_modules": "warm_probe_mod", "PYTHONPATH": str(probe_module)}  # fmt: skip
    return ray_head.start(state_dir=tmp_path / "head", num_gpus=0, num_cpus=4, env=env, dashboard=False)


def drive(head: ray_head.Head, envs: dict, driver_env: dict) -> dict:
    env = {**ray_head.driver_env(head), **driver_env}
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(envs)], env=env, capture_output=True, text=True, timeout=180)
    lines = [l for l in out.stdout.splitlines() if l.startswith("REPORT ")]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[0][len("REPORT "):])


def test_actors_start_in_the_heads_preloaded_idle_workers(tmp_path, probe_module):
    """The head starts exactly the workers asked for (the raylet's command line says so, and no
    more appear), each imported the preloaded module; with the launcher patch's variable naming
    the head's environment, the job's actor runs in one of them (started and preloaded before the
    driver connected) with Trinity's variable inherited from the head. Without that variable (as
    upstream Trinity) the actor gets a new worker, its variable from the job's runtime_env."""
    trinity = {"TRINITY_LOG_DIR": str(tmp_path / "job/log"), "TRINITY_LOG_LEVEL": "INFO"}
    head = start_head(tmp_path, probe_module, trinity, workers=1)
    try:
        cmdline = Path(f"/proc/{raylet_pid(head)}/cmdline").read_bytes().split(b"\0")
        assert b"--num_prestart_python_workers=1" in cmdline
        deadline = time.monotonic() + 60
        while not idle_workers(head) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # none more come
        (idle,) = idle_workers(head)
        warm = drive(head, trinity, warm_workers.driver_env(trinity))
        assert warm["pid"] == idle
        assert warm["preloaded_at"] is not None and warm["preloaded_at"] < warm["connected"]
        assert warm["process_started"] < warm["connected"]
        assert warm["log_dir"] == trinity["TRINITY_LOG_DIR"]

        cold = drive(head, trinity, {})
        assert cold["pid"] != idle
        assert cold["process_started"] >= cold["connected"] - 1  # a process started for the job
        assert cold["log_dir"] == trinity["TRINITY_LOG_DIR"]  # from the runtime_env
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)  # cleanup: its GCS outlasts a SIGTERM's 30 s grace


def test_a_mismatch_falls_back_to_the_runtime_env(tmp_path, probe_module):
    """The head has another log dir than the config: the job passes the config's as its runtime_env,
    and the actor sees the config's (never the head's)."""
    head = start_head(tmp_path, probe_module, {"TRINITY_LOG_DIR": str(tmp_path / "other/log")}, workers=1)
    try:
        envs = {"TRINITY_LOG_DIR": str(tmp_path / "job/log")}
        got = drive(head, envs, warm_workers.driver_env({"TRINITY_LOG_DIR": str(tmp_path / "other/log")}))
        assert got["log_dir"] == envs["TRINITY_LOG_DIR"]
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)  # cleanup: its GCS outlasts a SIGTERM's 30 s grace


def test_prestart_count_zero_and_a_bad_value(tmp_path, probe_module):
    head = start_head(tmp_path, probe_module, {}, workers=0)
    try:
        time.sleep(4)
        assert idle_workers(head) == []
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)  # cleanup: its GCS outlasts a SIGTERM's 30 s grace
    env = {**os.environ, warm_workers.PRESTART_VAR: "many"}
    with pytest.raises(Exception) as info:
        ray_head.start(state_dir=tmp_path / "bad", num_gpus=0, num_cpus=1, env=env, dashboard=False, attempts=1)
    log = (tmp_path / "bad" / "ray-start.log").read_text()
    assert "RFTSTACK_RAY_PRESTART_WORKERS must be a whole number" in log, (info.value, log[-2000:])


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_serve_starts_its_head_with_one_warm_worker_per_actor(tmp_path, serve_runner):
    """The default of `rftstack serve` (RFTSTACK_WARM_WORKERS unset): its own head is started with one
    idle worker per actor of the config, preloading Trinity's actor modules, and Trinity's variables
    for the config; trinity (here its TEST DOUBLE) is told those variables. --warm-workers 0: none."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\ncluster: {node_num: 1, gpu_per_node: 1}\n"
                   "explorer:\n  rollout_model: {engine_num: 2}\nlog: {level: DEBUG}\n")  # fmt: skip
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "-c", str(cfg)], fake="check_ray", RFTSTACK_WARM_WORKERS="")
    assert run.wait_event("ready", timeout=400), (run.finish(), run.stderr)
    st = run.status()
    assert st["ray"]["warm_workers"] == 6
    raylet = [p for p in supervisor.tagged(st["ray"]["tag"]) if p.cmdline.split(" ")[0].endswith("/raylet")][0]
    assert "--num_prestart_python_workers=6" in Path(f"/proc/{raylet.pid}/cmdline").read_bytes().decode().split("\0")
    head = environ_of(raylet.pid)
    assert head["RAY_preload_python_modules"] == ",".join(warm_workers.PRELOAD)
    # the engine actors inherit the head's environment, not trinity's: the loopback settings are there
    assert {k: head.get(k) for k in serve_config.loopback_env()} == serve_config.loopback_env()
    trinity_pid = json.loads((tmp_path / "fake-pids.json").read_text())["trinity"]
    told = json.loads(environ_of(trinity_pid)[warm_workers.HEAD_ENV_VAR])
    assert told == {k: head[k] for k in told} and told["TRINITY_LOG_LEVEL"] == "DEBUG"
    assert told["TRINITY_LOG_DIR"] == str(tmp_path / "run0" / "checkpoints" / "Trinity-RFT" / "rft" / "log")
    assert "6 idle Ray workers start with the head" in run.stderr_text()
    run.kill()

    off = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "--warm-workers", "0", "-c", str(cfg)], fake="check_ray")
    assert off.wait_event("ready", timeout=400), (off.finish(), off.stderr)
    st = off.status()
    assert st["ray"]["warm_workers"] == 0
    raylet = [p for p in supervisor.tagged(st["ray"]["tag"]) if p.cmdline.split(" ")[0].endswith("/raylet")][0]
    assert "RAY_preload_python_modules" not in environ_of(raylet.pid)
    assert warm_workers.HEAD_ENV_VAR not in environ_of(json.loads((tmp_path / "fake-pids.json").read_text())["trinity"])
    off.kill()


def test_warm_workers_bad_input_is_one_sentence(tmp_path, serve_runner):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\ncluster: {node_num: 1, gpu_per_node: 1}\nexplorer: {}\n")
    run = serve_runner(["--skip-doctor", "--warm-workers", "-1", "-c", str(cfg)])
    assert run.finish(timeout=60) == 2 and "--warm-workers -1: give a number of idle Ray workers" in run.stderr
    run = serve_runner(["--skip-doctor", "-c", str(cfg)], RFTSTACK_WARM_WORKERS="lots")
    assert run.finish(timeout=60) == 2 and "RFTSTACK_WARM_WORKERS='lots': give a number" in run.stderr
    run = serve_runner(["--skip-doctor", "--warm-workers", "2", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent", "-c", str(cfg)])
    assert run.finish(timeout=60) == 2 and "--warm-workers starts idle workers with this serve's own Ray head" in run.stderr
    assert "Traceback" not in run.stderr
