"""Trinity's synchronizer on real files, with Trinity's real code (no GPU involved in this part).

`Synchronizer._find_verl_latest_state_dict` polls `<job>/latest_state_dict_iteration.txt` and, after
loading a newer step, `_remove_previous_state_dict` deletes `global_step_<previous>` unless it holds
`.full_checkpoint`. The synchronizer's methods run unmodified; the object is built without
`__init__` (which would start Ray-actor housekeeping tasks) and `set_model_state_dict` is Trinity's
own (it only records the version: loading weights into engines is the explorer's job, not here).

Each scenario runs in a child interpreter with a timeout, because the unpatched loop blocks its
event loop (the child is killed if it hangs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rftstack.stack import patches
from rftstack.stack import policy

REL = "trinity/manager/synchronizer.py"

SCENARIO = r'''
import asyncio, importlib.util, json, logging, os, sys, threading, time, types
source, job = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_loader("synchronizer_under_test", loader=None)
mod = importlib.util.module_from_spec(spec)
exec(compile(open(source).read(), source, "exec"), mod.__dict__)

class Count(logging.Handler):
    n = 0
    def emit(self, record):
        if record.levelno == logging.WARNING:
            Count.n += 1
log = logging.getLogger("synchronizer-under-test"); log.propagate = False; log.addHandler(Count()); log.setLevel(logging.INFO)

sync = object.__new__(mod.Synchronizer)      # Trinity's class, its __init__ skipped (Ray actor setup)
sync.logger, sync.config = log, types.SimpleNamespace(checkpoint_job_dir=job)
sync._ready_condition, sync.model_state_dict, sync.model_version, sync.model_path = asyncio.Condition(), None, 0, None
it = os.path.join(job, "latest_state_dict_iteration.txt")
beats = [0]
out = {}

def trainer():                                # writes the iteration file as Trinity's trainer does
    time.sleep(1.5)
    out["beats_while_half_written"], out["warnings_while_half_written"] = beats[0], Count.n
    for step in (1, 2, 3):
        with open(it, "w") as f:
            f.write(str(step))
        time.sleep(1.6)
    out["version"] = sync.model_version
    out["left"] = sorted(os.listdir(job))
    print(json.dumps(out), flush=True)
    os._exit(0)

async def heartbeat():
    while True:
        beats[0] += 1
        await asyncio.sleep(0.1)

async def main():
    open(it, "w").close()                     # the trainer opened the file with "w" and wrote nothing yet
    threading.Thread(target=trainer, daemon=True).start()
    asyncio.get_running_loop().create_task(heartbeat())
    await sync._find_verl_latest_state_dict()

asyncio.run(main())
'''


def original_and_patched(tmp_path: Path) -> tuple[Path, Path]:
    import trinity

    text = (Path(trinity.__file__).parents[1] / REL).read_text()
    (p,) = [p for p in policy.load().patches if p.file == "trinity-synchronizer-unparsable-sleep.patch"]
    (fp,) = patches.parse((patches.patches_dir() / p.file).read_text())
    text = patches.undo(text, patches.patches_dir() / p.file, REL)  # the installed trinity may be patched already
    orig, patched = tmp_path / "synchronizer_orig.py", tmp_path / "synchronizer_patched.py"
    orig.write_text(text)
    patched.write_text(patches.apply_text(text, fp)[0])
    return orig, patched


def make_job(root: Path) -> Path:
    job = root / "job"
    (job / "global_step_1" / "actor").mkdir(parents=True)  # a state dict written only for weight sync
    (job / "global_step_1" / "actor" / "model.safetensors").write_bytes(b"sync-only")
    (job / "global_step_2" / "actor").mkdir(parents=True)  # a full checkpoint the user keeps
    (job / "global_step_2" / ".full_checkpoint").write_text("")
    (job / "global_step_2" / "actor" / "model.safetensors").write_bytes(b"keep me")
    return job


def run_scenario(source: Path, job: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", SCENARIO, str(source), str(job)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync")
    orig, patched = original_and_patched(tmp)
    return {name: run_scenario(src, make_job(tmp / name)) for name, src in (("original", orig), ("patched", patched))}


def test_unpatched_loop_starves_the_event_loop_on_a_half_written_file(results):
    r = results["original"]
    # 1.5 s of an empty iteration file: the heartbeat (every 0.1 s) ran at most at the very start,
    # and the loop logged a warning on every spin
    assert r["beats_while_half_written"] <= 2
    assert r["warnings_while_half_written"] > 1000


def test_patched_loop_keeps_the_event_loop_alive_and_then_loads(results):
    r = results["patched"]
    assert r["beats_while_half_written"] >= 8
    assert r["warnings_while_half_written"] <= 3
    assert r["version"] == 3


@pytest.mark.parametrize("variant", ["original", "patched"])
def test_reload_deletes_sync_only_steps_and_keeps_full_checkpoints(results, variant):
    # step 1 -> 2 removed global_step_1 (no marker); 2 -> 3 kept global_step_2 (.full_checkpoint)
    assert results[variant]["left"] == ["global_step_2", "latest_state_dict_iteration.txt"]
    assert results[variant]["version"] == 3


def test_serve_refuses_a_checkpoint_dir_with_unmarked_steps(tmp_path):
    from rftstack.run import serve

    job = make_job(tmp_path)
    assert serve.unmarked_steps(job) == ["global_step_1"]
    assert serve.unmarked_steps(tmp_path / "absent") == []
    with pytest.raises(Exception) as exc:
        serve.guard_checkpoints(str(job))
    assert str(exc.value) == (
        f"{job}/global_step_1 has no .full_checkpoint marker, and Trinity's synchronizer deletes such a directory "
        f"after it loads a newer step; move it out of {job} or mark it to keep (touch {job}/global_step_1/.full_checkpoint)"
    )
    (job / "global_step_1" / ".full_checkpoint").write_text("")
    serve.guard_checkpoints(str(job))  # all marked: fine
