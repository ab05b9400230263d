"""patches/vllm-fork-workers.patch: with RFTSTACK_VLLM_FORK_WORKERS unset (the default since the H200 measured
it) or 1, a process spawned from a Ray actor (the EngineCore of Trinity's engine actor) forks its vLLM worker
processes, as bare `vllm serve`'s EngineCore does, instead of spawning them; a Ray actor itself, and a process
outside Ray, keep upstream's choice. 0: upstream.

Real: a Ray head of its own (a driver script in a subprocess), Ray actors, and the installed vLLM's
``get_mp_context`` (vllm/utils/system_utils.py, patched, and the published text from ``patches.undo``) in
the actor and in a process the actor starts with its environment, as vLLM starts the EngineCore. The
start method is what each process's ``get_mp_context()`` returns: what vLLM would use to start the
EngineCore (in the actor) and the workers (in the child). No GPU here: CUDA is never initialized, so the
patch's fallback to upstream's own reasons (CUDA initialized) is not exercised.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patch_helpers import VLLM_FORK_REL as REL
from rftstack.stack import patches, policy

VAR = "RFTSTACK_VLLM_FORK_WORKERS"
MARK = "RFTSTACK_VLLM_SPAWN_FROM_RAY_ACTOR"

pytestmark = pytest.mark.slow

# loads vllm.utils.system_utils, or (argv[1] a path) the published text of it as a module of its own
LOAD = r'''
import sys, types
def load(path):
    if not path:
        import vllm.utils.system_utils as m
        return m
    m = types.ModuleType("vllm.utils.system_utils_published")
    m.__file__, m.__package__ = path, "vllm.utils"  # its relative imports are vllm.utils'
    exec(compile(open(path).read(), path, "exec"), m.__dict__)
    return m
'''

CHILD = LOAD + r'''
print(load(sys.argv[1]).get_mp_context().get_start_method())
'''

DRIVER = LOAD + r'''
import json, os, subprocess, ray
CHILD = sys.argv[1]

@ray.remote(num_cpus=0)
class EngineActor:
    """Stands where Trinity's engine actor stands: a Ray actor that builds a vLLM engine."""
    def methods(self, published, trinity_sets_spawn):
        if trinity_sets_spawn:  # trinity/common/models/vllm_model.py does this before building the engine
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        actor = load(published).get_mp_context().get_start_method()
        child = subprocess.run([sys.executable, "-c", CHILD, published], capture_output=True, text=True,
                               env=dict(os.environ), timeout=300)
        return {"actor": actor, "child": (child.stdout.strip().splitlines() or [""])[-1],
                "child_rc": child.returncode, "child_err": child.stderr[-800:], "mark": os.environ.get("''' + MARK + r'''")}

ray.init(address="local", num_cpus=2, include_dashboard=False)
out = {}
cases = json.loads(sys.argv[2])
actors = {name: EngineActor.options(runtime_env={"env_vars": c["env"]}).remote() for name, c in cases.items()}
refs = {name: actors[name].methods.remote(c["published"], c["trinity_sets_spawn"]) for name, c in cases.items()}
for name, ref in refs.items():
    out[name] = ray.get(ref, timeout=600)
print("RESULT " + json.dumps(out))
ray.shutdown()
'''


def published_text(tmp_path) -> str:
    spec = importlib.util.find_spec("vllm")  # found, not imported: the import takes seconds, the file is enough
    assert spec is not None and spec.origin, "vLLM is not installed"
    p = next(p for p in policy.load().patches if p.file == "vllm-fork-workers.patch")
    path = tmp_path / "system_utils_published.py"
    text = patches.undo((Path(spec.origin).parents[1] / REL).read_text(), patches.patches_dir() / p.file, REL)
    assert text is not None, "vllm-fork-workers.patch is not applied to the installed vLLM: run `rftstack relax`"
    path.write_text(text)
    return str(path)


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (VAR, MARK, "VLLM_WORKER_MULTIPROC_METHOD", "RAY_ADDRESS")}
    env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # under `uv run`, Ray would build its workers a venv of its own
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def in_actors(tmp_path_factory):
    published = published_text(tmp_path_factory.mktemp("fork"))
    cases = {
        "switched on, Trinity sets spawn": {"env": {VAR: "1"}, "published": "", "trinity_sets_spawn": True},
        "switched on, vLLM forces spawn": {"env": {VAR: "1"}, "published": "", "trinity_sets_spawn": False},
        "default": {"env": {}, "published": "", "trinity_sets_spawn": True},
        "switched off": {"env": {VAR: "0"}, "published": "", "trinity_sets_spawn": True},
        "as published": {"env": {VAR: "1"}, "published": published, "trinity_sets_spawn": True},
    }
    proc = subprocess.run([sys.executable, "-c", DRIVER, CHILD, json.dumps(cases)], capture_output=True, text=True,
                          env=clean_env(), timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_by_default_and_switched_on_a_process_below_a_ray_actor_forks_its_workers(in_actors):
    for name in ("default", "switched on, Trinity sets spawn", "switched on, vLLM forces spawn"):
        r = in_actors[name]
        assert r["child_rc"] == 0, r["child_err"]
        # the actor still spawns (the EngineCore), and marks that it did; the process below it forks
        assert (r["actor"], r["child"]) == ("spawn", "fork"), (name, r)
        assert r["mark"] and r["mark"].isdigit(), (name, r)


def test_switched_off_and_as_published_the_process_below_spawns_too(in_actors):
    for name in ("switched off", "as published"):
        r = in_actors[name]
        assert r["child_rc"] == 0, r["child_err"]
        assert (r["actor"], r["child"]) == ("spawn", "spawn"), (name, r)
        assert r["mark"] is None, (name, r)


def run_child(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, ""], capture_output=True, text=True, env=env, timeout=300)


def test_outside_ray_a_spawn_asked_for_stays_and_the_default_stays_fork():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the two children import vLLM side by side
        asked, default = pool.map(run_child, [clean_env(VLLM_WORKER_MULTIPROC_METHOD="spawn", **{VAR: "1"}), clean_env()])
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert asked.stdout.strip().splitlines()[-1] == "spawn"
    assert default.returncode == 0, default.stderr[-2000:]
    assert default.stdout.strip().splitlines()[-1] == "fork"


def test_a_mark_of_this_process_itself_changes_nothing():
    """The mark is the pid of the actor that spawned; a process that finds its own pid there (the actor
    itself, e.g. after Ray reused its process) keeps spawn. Here: a mark that cannot be another process's."""
    code = ("import os, sys; os.environ['" + MARK + "'] = str(os.getpid()); os.environ['" + VAR + "'] = '1'; "
            "os.environ['VLLM_WORKER_MULTIPROC_METHOD'] = 'spawn'; "
            "from vllm.utils.system_utils import get_mp_context; print(get_mp_context().get_start_method())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "spawn"


def test_a_bad_switch_value_stops_the_import_with_one_sentence():
    r = run_child(clean_env(**{VAR: "yes"}))
    assert r.returncode != 0
    assert f"{VAR} must be 1" in r.stderr and "or 0" in r.stderr and "'yes'" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_bare_vllm_serve_spawns_its_engine_core_and_workers():
    """What the patch's comment and docs/serve.md say of bare `vllm serve`: its CLI (vllm/entrypoints/cli/main.py,
    cli_env_setup) sets VLLM_WORKER_MULTIPROC_METHOD=spawn where the environment names no method, before it starts
    anything, so its EngineCore and (below it, with that variable) its worker are spawned, not forked. The real CLI;
    it then stops for want of a GPU here."""
    vllm_cli = Path(sys.executable).with_name("vllm")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    out = subprocess.run([str(vllm_cli), "serve", "/nonexistent/model", "--port", "1"], env={**env, "VLLM_LOGGING_LEVEL": "DEBUG"},
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    text = out.stdout + out.stderr
    assert "Setting VLLM_WORKER_MULTIPROC_METHOD to 'spawn'" in text, text[-3000:]
    named = subprocess.run([str(vllm_cli), "serve", "/nonexistent/model", "--port", "1"],
                           env={**env, "VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_WORKER_MULTIPROC_METHOD": "fork"},
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "Setting VLLM_WORKER_MULTIPROC_METHOD" not in named.stdout + named.stderr
