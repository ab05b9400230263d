"""patches/trinity-proxy-builders-early.patch: in serve mode Trinity's Explorer starts the proxy's builder
processes (trinity-proxy-build-processes.patch) when it is created, so they import while its models start,
and the proxy's service takes the same processes over; RFTSTACK_PROXY_BUILDERS_EARLY=0 starts them with the
proxy's app, as the build-processes patch alone does.

Real: a Ray cluster of this machine (one head, started by the child process), Trinity's installed Explorer
(with the policy's patches, `rftstack relax`) as a Ray actor built from the report's serve config (tests/helpers.py
write_report_config) on the tiny model, its real prepare() and serve(): the real ExplorerService, its proxy app
on a loopback port (whose start runs recorder.start_builders) and real builder processes (recorder.py run as
a script). What stands in: the models. A TEST DOUBLE for the Explorer's model allocator (the engines need a
GPU): its create_all_models notes the Explorer's builder processes and waits, at most START_WAIT_S, until each
has said it is ready (what an engine's minute of loading gives them on the GPU host), then returns model
doubles.

The behaviour this guards: without the patch (or switched off) no builder process exists until the proxy's
app starts, after every model is ready, so the first answers are built on the proxy's loop while the
builders import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_report_config
from rftstack.doctor.netstat import free_ports

VAR = "RFTSTACK_PROXY_BUILDERS_EARLY"
BUILD_VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"
RECORD_VAR = "RFTSTACK_PROXY_RECORD_PROCESSES"

# Child: one Ray head, then for each scenario (argv[2], JSON) a real Explorer actor with the TEST DOUBLE
# allocator, its prepare() and serve(), and a report: the double's notes, the builder processes the service
# holds once its app has started, and the builder processes running below the Explorer's process.
PROBE = r"""
import asyncio, concurrent.futures, json, os, socket, sys, time
import ray
from trinity.common.config import load_config
from trinity.explorer.explorer import Explorer

def builder_children(pid):
    '''The running processes whose parent is ``pid`` and that run the proxy's recorder.py as a script.'''
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if stat[0] != "Z" and int(stat[1]) == pid and any(c.endswith(b"/proxy/recorder.py") for c in cmd):
            found.append(int(entry))
    return sorted(found)

class ModelDouble:
    '''TEST DOUBLE for a rollout model wrapper: what the Explorer's serve mode asks of it without a request.'''
    @property
    async def model_version_async(self):
        return 0
    async def get_available_address_async(self, random_port=True):
        return "127.0.0.1", 1
    async def init_process_group(self, **kwargs):
        pass
    async def shutdown(self):
        pass

class AllocatorDouble:
    '''TEST DOUBLE for trinity.common.models.allocator.Allocator: no engine; it notes the Explorer's builder
    processes and lasts until each is ready (at most START_WAIT_S: a loaded machine may take long to import).'''
    START_WAIT_S = 300
    def __init__(self, explorer):
        self.explorer, self.notes = explorer, {}
    async def create_all_models(self):
        pool = self.explorer._rftstack_builders
        self.notes["pids_while_models_start"] = sorted(b.process.pid for b in pool.builders) if pool else []
        self.notes["children_while_models_start"] = builder_children(os.getpid())
        started = time.time()
        while pool and not all(b.ready for b in pool.builders) and time.time() - started < self.START_WAIT_S:
            await asyncio.sleep(0.1)
        self.notes["ready_while_models_start"] = bool(pool) and all(b.ready for b in pool.builders)
        self.notes["waited_s"] = time.time() - started
        return [ModelDouble()], []

class ExplorerWithModelDoubles(Explorer):
    '''Trinity's Explorer, prepare() and serve() and all; only its allocator is the double.'''
    def __init__(self, config):
        super().__init__(config)
        self.model_allocator = AllocatorDouble(self)
    def notes(self):
        return self.model_allocator.notes
    def proxy_builders(self):
        '''The builder processes the proxy's service holds, and whether each is ready (None: it holds none).'''
        pool = getattr(self.service, "_rftstack_builders", None)
        return None if pool is None else [[b.process.pid, b.ready] for b in pool.builders]
    def children(self):
        return builder_children(os.getpid())
    def pid(self):
        return os.getpid()

ray.init(address="local", num_cpus=4, include_dashboard=False)  # a head of its own
def scenario(sc):
    cfg = load_config(sys.argv[1]); cfg.check_and_update()
    cfg.explorer.listen_address, cfg.explorer.proxy_port = "127.0.0.1", sc["port"]
    env = {"RFTSTACK_PROXY_BUILDERS_EARLY": sc["early"], **sc["processes"]}
    actor = ray.remote(ExplorerWithModelDoubles).options(runtime_env={"env_vars": env}).remote(cfg)
    try:
        ray.get(actor.__ray_ready__.remote())
    except Exception as e:
        return {"error": str(e)}
    ray.get(actor.prepare.remote())
    serving = actor.serve.remote()  # Explorer.serve starts the service, then watches the model version for good
    end = time.monotonic() + 300  # the app's start (its lifespan) takes the builders over or starts them
    while True:
        try:
            socket.create_connection(("127.0.0.1", sc["port"]), timeout=5).close()  # uvicorn listens after the lifespan began
            held = ray.get(actor.proxy_builders.remote(), timeout=60)
            if held and all(ready for _, ready in held):
                break
        except OSError:
            pass
        assert not ray.wait([serving], timeout=0)[0], ray.get(serving)  # raises the serve's error, if it ended
        assert time.monotonic() < end, "the proxy's app did not start with ready builders in 300 s"
        time.sleep(0.2)
    out = {"error": None, "notes": ray.get(actor.notes.remote()), "held": held,
           "children": ray.get(actor.children.remote()), "pid": ray.get(actor.pid.remote())}
    ray.kill(actor)
    return out

scenarios = json.loads(sys.argv[2])
with concurrent.futures.ThreadPoolExecutor(2) as lanes:  # each is mostly one process importing Trinity
    results = dict(zip(scenarios, lanes.map(scenario, scenarios.values())))
ray.shutdown()
print("PROBE " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model) -> tuple[dict, str]:
    cfg = write_report_config(tmp_path_factory.mktemp("builders-early") / "serve.yaml", tiny_model)
    early, late, recording, bad = free_ports(4)  # distinct: the scenarios run side by side
    builders, recorders = {BUILD_VAR: "2"}, {RECORD_VAR: "2"}
    scenarios = {"early": {"early": "1", "processes": builders, "port": early},
                 "with_the_app": {"early": "0", "processes": builders, "port": late},
                 "recording": {"early": "1", "processes": recorders, "port": recording},
                 "bad_value": {"early": "soon", "processes": builders, "port": bad}}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", VAR, BUILD_VAR, RECORD_VAR)}
    env["RAY_DEDUP_LOGS"] = "0"  # every actor's log line reaches the child's output
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # under `uv run`, Ray would ship the worktree and re-sync a venv of its own
    out = subprocess.run([sys.executable, "-c", PROBE, str(cfg), json.dumps(scenarios)], capture_output=True, text=True,
                         timeout=900, env=env)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    print(line)  # shown with a failure
    return json.loads(line[len("PROBE "):]), out.stdout + out.stderr


def test_early_the_builders_start_and_are_ready_while_the_models_start(runs):
    early = runs[0]["early"]
    assert early["error"] is None
    notes = early["notes"]
    assert len(notes["pids_while_models_start"]) == 2
    assert notes["children_while_models_start"] == notes["pids_while_models_start"]  # running, the Explorer's own
    assert notes["ready_while_models_start"] is True, notes


def test_early_the_proxy_takes_the_same_processes_over(runs):
    early = runs[0]["early"]
    # the service's pool is the Explorer's: the same two processes, and no others were started with the app
    assert sorted(pid for pid, _ in early["held"]) == early["notes"]["pids_while_models_start"]
    assert early["children"] == early["notes"]["pids_while_models_start"]


def test_switched_off_the_builders_start_with_the_proxys_app(runs):
    off = runs[0]["with_the_app"]
    assert off["error"] is None
    assert off["notes"]["pids_while_models_start"] == [] and off["notes"]["children_while_models_start"] == []
    assert off["notes"]["ready_while_models_start"] is False
    assert len(off["held"]) == 2 and sorted(pid for pid, _ in off["held"]) == off["children"]


def test_recording_processes_start_with_the_proxys_app_even_when_early(runs):
    """docs/serve.md: recording processes need the service's table, so they start with the app either way."""
    rec = runs[0]["recording"]
    assert rec["error"] is None
    assert rec["notes"]["pids_while_models_start"] == [] and rec["notes"]["children_while_models_start"] == []
    assert len(rec["held"]) == 2 and sorted(pid for pid, _ in rec["held"]) == rec["children"]


def explorer_log(runs, name: str) -> list[str]:
    """The log lines of the scenario's Explorer actor, in order (RAY_DEDUP_LOGS=0: each line reaches the child)."""
    return [ln for ln in runs[1].splitlines() if f"ExplorerWithModelDoubles pid={runs[0][name]['pid']})" in ln]


@pytest.mark.parametrize("name, said, before", [
    ("early", f"Experience builders: 2 processes ({BUILD_VAR}=2", True),
    ("with_the_app", f"Experience builders: 2 processes ({BUILD_VAR}=2", False),
    ("recording", f"Experience recorders: 2 processes ({RECORD_VAR}=2", False)])  # fmt: skip
def test_the_explorers_log_names_the_processes_before_the_models_are_ready_or_after(runs, name, said, before):
    """docs/serve.md: early, the Explorer's log names the builders before `All models are ready.`; switched off,
    after it (the proxy's app starts them); recording processes after it either way."""
    log = explorer_log(runs, name)
    named = [i for i, ln in enumerate(log) if said in ln]
    models = [i for i, ln in enumerate(log) if "All models are ready." in ln]
    assert len(named) == 1 and len(models) == 1, log[-20:]  # one pool: the service took the Explorer's over
    assert (named[0] < models[0]) is before


def test_a_bad_switch_value_stops_the_explorer_with_one_sentence(runs):
    bad = runs[0]["bad_value"]
    assert bad["error"] is not None
    assert (f"{VAR} must be 1 (start the proxy's builder processes while the models start, the default) or 0 (when "
            f"the proxy's app starts), not 'soon'") in bad["error"]  # fmt: skip


def test_the_policy_names_this_test():
    policy = (Path(__file__).resolve().parents[2] / "python" / "rftstack" / "data" / "policy.toml").read_text()
    entry = policy[policy.index('file = "trinity-proxy-builders-early.patch"'):]
    assert "tests/stack/test_proxy_builders_early.py" in entry[: entry.index("[[patch]]")]
