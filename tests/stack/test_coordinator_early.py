"""patches/trinity-coordinator-early.patch: Trinity's Explorer.prepare creates the rollout coordinator's
actor while the models start (in serve mode its prepare runs then too), not after them;
RFTSTACK_COORDINATOR_EARLY=0 restores upstream's order.

Real: a Ray cluster of this machine (one head, started by the child process), Trinity's installed
Explorer (with the policy's patches, `rftstack relax`) as a Ray actor built from the report's serve
config (tests/helpers.py write_report_config) on the tiny model, its real prepare(), Synchronizer and
RolloutCoordinator (whose serve-mode prepare builds the real experience pipeline and its SQL writer).
What stands in: the models. A TEST DOUBLE for the Explorer's model allocator (the engines need a GPU):
its create_all_models sleeps, notes whether the Explorer has created its coordinator by then (and whether
that actor's process has started), then returns model doubles whose shutdown is recorded (or raises).

The upstream behaviour this guards: as published (switch at 0) the coordinator's actor is created
only once the models are ready, so its process start and imports add to the time to ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import write_report_config

VAR = "RFTSTACK_COORDINATOR_EARLY"

# Child: one Ray head, then for each scenario (argv[2], JSON) a real Explorer actor with the TEST
# DOUBLE models, its prepare(), and a report: prepare's error, the double's notes, the gap between the
# models' end and prepare's end, and the coordinator actors that Explorer made alive afterwards.
# LANES scenarios run at once on the one head (each is mostly one process importing Trinity, one core
# of CI's two); the coordinators counted are the scenario's own (owned by its Explorer's worker).
PROBE = r"""
import asyncio, concurrent.futures, json, sys, time
import ray
from ray._private import state as ray_state
from trinity.common.config import load_config
from trinity.explorer.explorer import Explorer

LANES = 2

def coordinators(explorer_id):
    actors = ray_state.actors()
    owner = actors[explorer_id]["Address"]["Port"]  # the Explorer's worker, owner of the coordinator it made
    return sorted(a["State"] for a in actors.values() if a["ActorClassName"].endswith("RolloutCoordinator")
                  and a["OwnerAddress"]["Port"] == owner and a["State"] != "DEAD")

class ModelDouble:
    '''TEST DOUBLE for a rollout model wrapper: its weight sync group set-up and shutdown are recorded.'''
    def __init__(self, notes):
        self.notes = notes
    async def get_available_address_async(self, random_port=True):
        return "127.0.0.1", 1
    async def init_process_group(self, **kwargs):
        self.notes["weight_sync_group"] = time.time()
    async def shutdown(self):
        self.notes["models_shut_down"] = self.notes.get("models_shut_down", 0) + 1

class AllocatorDouble:
    '''TEST DOUBLE for trinity.common.models.allocator.Allocator: no engine, a sleep (or an error).
    Real engines take longer to start than an actor's process (a minute and more on the GPU host), so
    after its sleep the double also lasts until the Explorer's coordinator, when it made one, has started,
    for at most START_WAIT_S: a loaded machine may take longer than any fixed sleep to start a process.'''
    START_WAIT_S = 300
    def __init__(self, explorer, sleep_s, fail):
        self.explorer, self.sleep_s, self.fail, self.notes = explorer, sleep_s, fail, {}
    async def create_all_models(self):
        await asyncio.sleep(self.sleep_s)
        coordinator = self.explorer.rollout_coordinator  # the Explorer's handle, when it made one
        self.notes["coordinator_when_models_done"] = "none"
        if coordinator is not None:
            self.notes["coordinator_when_models_done"] = "created"
            started = time.time()
            try:  # its process starts (imports) while the models start
                await asyncio.wait_for(asyncio.wrap_future(coordinator.__ray_ready__.remote().future()),
                                       self.START_WAIT_S)
                self.notes["coordinator_when_models_done"] = "started"
            except asyncio.TimeoutError:
                pass
            self.notes["waited_for_coordinator_s"] = time.time() - started
        self.notes["models_done"] = time.time()
        if self.fail:
            raise RuntimeError("the models double failed")
        return [ModelDouble(self.notes)], []

class ExplorerWithModelDoubles(Explorer):
    '''Trinity's Explorer, prepare() and all; only its allocator is the double.'''
    def __init__(self, config, sleep_s, fail):
        super().__init__(config)
        self.model_allocator = AllocatorDouble(self, sleep_s, fail)
    def notes(self):
        return self.model_allocator.notes

config = load_config(sys.argv[1])
config.check_and_update()
ray.init(address="local", num_cpus=4, include_dashboard=False, namespace=config.ray_namespace)  # a head of its own
def scenario(sc):
    begun = time.time()
    cfg = load_config(sys.argv[1]); cfg.check_and_update()
    if sc.get("bad_operator"):  # the real coordinator's prepare then fails on the unknown operator
        from trinity.common.config import OperatorConfig
        cfg.data_processor.experience_pipeline.operators = [OperatorConfig(name="no_such_operator")]
    actor = ray.remote(ExplorerWithModelDoubles).options(runtime_env={"env_vars": {"RFTSTACK_COORDINATOR_EARLY": sc["early"]}}
                                                        ).remote(cfg, sc["sleep_s"], sc.get("fail_models", False))
    ray.get(actor.__ray_ready__.remote())
    error = None
    try:
        ray.get(actor.prepare.remote())
    except Exception as e:
        error = str(e)
    done = time.time()
    notes = ray.get(actor.notes.remote())
    explorer_id = actor._actor_id.hex()
    left = coordinators(explorer_id)
    end = time.monotonic() + 60  # an actor whose handles are gone is destroyed by Ray shortly after
    while error and left and time.monotonic() < end:
        time.sleep(0.2); left = coordinators(explorer_id)
    if not error:
        ray.get(actor.shutdown.remote())
    ray.kill(actor)
    return {"error": error, "notes": notes, "gap_s": done - notes["models_done"], "alive_after": left,
            "wall_s": time.time() - begun}

scenarios = json.loads(sys.argv[2])
with concurrent.futures.ThreadPoolExecutor(LANES) as lanes:
    results = dict(zip(scenarios, lanes.map(scenario, scenarios.values())))
ray.shutdown()
print("PROBE " + json.dumps(results))
"""


def run_probe(config_path, scenarios: dict) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", VAR)}
    env["RAY_DEDUP_LOGS"] = "0"  # every actor's log line reaches the child's output, none folded into another
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # under `uv run`, Ray would ship the worktree and re-sync a venv of its own
    out = subprocess.run([sys.executable, "-c", PROBE, str(config_path), json.dumps(scenarios)], capture_output=True,
                         text=True, timeout=900, env=env)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    print(line)  # shown with a failure
    return json.loads(line[len("PROBE "):]), out.stdout + out.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model) -> tuple[dict, str]:
    cfg = write_report_config(tmp_path_factory.mktemp("coordinator") / "serve.yaml", tiny_model)
    return run_probe(cfg, {
        "early": {"early": "1", "sleep_s": 5},
        "upstream": {"early": "0", "sleep_s": 5},
        "models_fail": {"early": "1", "sleep_s": 5, "fail_models": True},
        "coordinator_fails": {"early": "1", "sleep_s": 5, "bad_operator": True},
        "both_fail": {"early": "1", "sleep_s": 5, "fail_models": True, "bad_operator": True},
    })  # fmt: skip


def test_early_the_coordinator_starts_while_the_models_start(runs):
    early = runs[0]["early"]
    assert early["error"] is None
    # created, started and prepared (serve mode) while the double's models were starting
    assert early["notes"]["coordinator_when_models_done"] == "started"
    assert early["alive_after"] == ["ALIVE"]
    assert early["notes"].get("models_shut_down", 0) == 0
    assert early["notes"]["weight_sync_group"] >= early["notes"]["models_done"]  # set up after the models, as before


def test_switched_off_the_coordinator_starts_after_the_models(runs):
    up, early = runs[0]["upstream"], runs[0]["early"]
    assert up["error"] is None
    assert up["notes"]["coordinator_when_models_done"] == "none"
    assert up["alive_after"] == ["ALIVE"]
    # after the models: the coordinator's process start, imports and prepare, all on the path to ready
    assert up["gap_s"] > 2 * early["gap_s"] and up["gap_s"] > 1.0, (up["gap_s"], early["gap_s"])


def test_log_lines_keep_their_order(runs):
    log = runs[1]
    # the two runs that succeed, and the models' line of the run whose coordinator fails
    counts = {m: log.count(m) for m in ("All models are ready.", "Rollout coordinator is ready.", "Explorer is ready.")}
    assert counts == {"All models are ready.": 3, "Rollout coordinator is ready.": 2, "Explorer is ready.": 2}, counts
    pos = [log.index(m) for m in ("All models are ready.", "Rollout coordinator is ready.", "Explorer is ready.")]
    assert pos == sorted(pos)


def test_a_models_failure_ends_prepare_with_its_error_and_no_coordinator_left(runs):
    failed = runs[0]["models_fail"]
    assert failed["error"] is not None and "the models double failed" in failed["error"]
    assert failed["notes"]["coordinator_when_models_done"] in ("created", "started")  # made early
    assert failed["alive_after"] == []  # shut down and released with the failed prepare


def test_a_coordinator_failure_ends_prepare_with_its_error_after_shutting_the_models_down(runs):
    failed = runs[0]["coordinator_fails"]
    assert failed["error"] is not None and "no_such_operator" in failed["error"]  # Trinity: "Invalid module key: ..."
    assert failed["notes"]["models_shut_down"] == 1  # shutdown ran, as upstream does on any failure
    assert failed["alive_after"] == []


def test_both_failing_the_models_error_is_raised_and_the_coordinators_logged(runs):
    both, log = runs[0]["both_fail"], runs[1]
    assert both["error"] is not None and "the models double failed" in both["error"]
    assert "The rollout coordinator failed too" in log and "no_such_operator" in log
    assert both["alive_after"] == []


def test_a_bad_switch_value_stops_the_import_with_one_sentence():
    """RFTSTACK_COORDINATOR_EARLY is read when trinity/explorer/explorer.py is imported: 1 (the
    default) or 0; another value stops the import, so the Explorer's start, with one sentence."""
    # the child's import and this process's own run side by side (each is seconds of imports)
    child = subprocess.Popen([sys.executable, "-c", "import trinity.explorer.explorer"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "RFTSTACK_COORDINATOR_EARLY": "yes"})  # fmt: skip
    try:
        from trinity.explorer import explorer

        assert explorer.coordinator_early_enabled({}) is True
        assert explorer.coordinator_early_enabled({"RFTSTACK_COORDINATOR_EARLY": "0"}) is False
        _, stderr = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode != 0
    assert "RFTSTACK_COORDINATOR_EARLY must be 1 (start the rollout coordinator while the models start, the default) or 0" in stderr
