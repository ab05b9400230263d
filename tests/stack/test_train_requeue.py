"""A batch read for a training step survives a trainer crash (patches/trinity-sql-read-requeue.patch).

Guards an upstream behaviour: Trinity 0.6.0's SQL reader (trinity/buffer/storage/sql.py
`_read_priority`) marks a batch consumed when it reads it, before the step trains it, so a trainer
killed before the checkpoint of that step was saved never trains that batch after a restart. The
[unpatched] cases run Trinity's original files and show the loss.

Real: Trinity's config (`load_config` + `check_and_update` on rftstack's effective train config),
its SQL writer (`get_buffer_writer`, what the serve's pipeline writes committed experiences with)
filling the SQLite store, the trainer's sample strategy (`SAMPLE_STRATEGY`, built as
trinity/trainer/trainer.py builds it and called with the step as `Trainer._sample_data` calls it)
and its SQL reader; the resume step comes from verl's `find_latest_ckpt_path` on the job
directory, as Trinity's VERLTrainer._load_checkpoint finds it; a crash is a real SIGKILL of the
trainer's process. TEST DOUBLE: the training step and the checkpoint save (no GPU here): a step
adds 1 to the step counter; a saved checkpoint is `global_step_N/` plus
`latest_checkpointed_iteration.txt`, written when the save has finished, as Trinity's
CheckpointMonitor does. One deviation from a deployment: the SQL storage runs in the trainer's
process (`wrap_in_ray: false`) instead of in a Ray actor; the storage code is the same.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from helpers import experience_reads, run_python
from rftstack.run import train_config

BATCH = 3

TRAINER = r"""
import asyncio, json, os, signal, sys
from pathlib import Path
site, cfg_path, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, site)
import torch
import trinity
assert trinity.__file__.startswith(site), trinity.__file__
from trinity.algorithm import SAMPLE_STRATEGY
from trinity.buffer.buffer import get_buffer_writer
from trinity.common.config import load_config
from trinity.common.experience import EID, Experience
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

cfg = load_config(cfg_path)
cfg.check_and_update()
job = Path(cfg.checkpoint_job_dir)
eb = cfg.buffer.trainer_input.experience_buffer
eb.max_read_timeout = 2  # the wait for a full batch, short here


def say(**kw):
    print("EVENT " + json.dumps(kw), flush=True)


async def commit(names):
    # Trinity's SQL writer, as the serve's pipeline writes a /commit
    sc = eb.to_storage_config()
    sc.wrap_in_ray = False
    writer = get_buffer_writer(sc)
    await writer.write([Experience(eid=EID(task=n, suffix=n), tokens=torch.tensor([1, 2, 3, 4]), prompt_length=2,
                                   logprobs=torch.tensor([-0.5, -0.25]), reward=1.0, info={"model_version": 0})
                        for n in names])


async def trainer(actions):
    found = find_latest_ckpt_path(str(job))  # as VERLTrainer._load_checkpoint resumes
    step = int(found.split("global_step_")[-1]) if found else 0
    say(resumed=step)
    strategy = SAMPLE_STRATEGY.get(cfg.algorithm.sample_strategy)(
        buffer_config=cfg.buffer, **(cfg.algorithm.sample_strategy_args or {}))
    strategy.exp_buffer.wrap_in_ray = False  # the deviation named in the test's docstring
    for action in actions:
        if action == "step":  # Trainer.train: sample for step + 1, then the training step (DOUBLE)
            try:
                exps, _, _ = await strategy.sample(step + 1)
            except StopAsyncIteration:
                say(step=step + 1, read=None)
                return
            say(step=step + 1, read=sorted(e.eid.suffix for e in exps))
            step += 1
        elif action == "save":  # the checkpoint of this step, saved (DOUBLE of verl's save)
            (job / f"global_step_{step}" / "actor").mkdir(parents=True)
            (job / "latest_checkpointed_iteration.txt").write_text(str(step))
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)


async def main():
    if plan.get("commit"):
        for i in range(0, len(plan["commit"]), 3):
            await commit(plan["commit"][i:i + 3])
    await trainer(plan["trainer"])

asyncio.run(main())
"""


def train_yaml(tmp_path: Path, model: Path) -> Path:
    """rftstack's effective train config (the serve's SQLite store in the job directory)."""
    user = train_config.example(str(model), checkpoint_root_dir=str(tmp_path / "ckpt"), project="report", name="qwen3b",
                                max_model_len=2048, train_batch_size=BATCH, total_steps=10)  # fmt: skip
    cfg, _ = train_config.effective(user, ray_address="127.0.0.1:2", flash_attn=True)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_trainer(site: Path, cfg: Path, plan: dict, killed: bool = False, env: dict | None = None) -> list[dict]:
    """One trainer process; its events (what it resumed from, what each step read)."""
    out = run_python(TRAINER, str(site), str(cfg), json.dumps(plan), timeout=300, env=env)
    assert out.returncode == (-9 if killed else 0), out.stderr[-4000:]
    return [json.loads(line[6:]) for line in out.stdout.splitlines() if line.startswith("EVENT ")]


def store(tmp_path: Path) -> tuple[dict[str, int], dict[int, list[str]] | None]:
    """Per experience its `consumed`; per step the experiences its batch took (None: no side table)."""
    return experience_reads(tmp_path / "ckpt/report/qwen3b/buffer/experience_buffer.db")


# nine experiences in three commits; the reader takes the newest unconsumed first
NAMES = [f"e{i}" for i in range(9)]
A, B, C = NAMES[6:], NAMES[3:6], NAMES[:3]


@pytest.mark.slow
@pytest.mark.parametrize("patched", [True, False], ids=["patched", "unpatched"])
def test_batch_of_a_killed_step_is_trained_after_restart(policy_site, original_site, tiny_model, tmp_path, patched):
    """Step 1 reads batch A and its checkpoint is saved; step 2 reads batch B, then kill -9 before
    checkpoint 2. The restarted trainer resumes from checkpoint 1 and its step 2 reads B again
    (requeued), step 3 reads C, then no batch is left: A is never read again, every experience
    consumed once. As published, the restarted step 2 reads C and B is never trained."""
    site = policy_site if patched else original_site
    cfg = train_yaml(tmp_path, tiny_model)
    first = run_trainer(site, cfg, {"commit": NAMES, "trainer": ["step", "save", "step", "kill"]}, killed=True)
    assert first == [{"resumed": 0}, {"step": 1, "read": A}, {"step": 2, "read": B}]
    after = run_trainer(site, cfg, {"trainer": ["step", "save", "step", "save", "step"]})
    consumed, steps = store(tmp_path)
    if patched:
        assert after == [{"resumed": 1}, {"step": 2, "read": B}, {"step": 3, "read": C}, {"step": 4, "read": None}]
        assert consumed == dict.fromkeys(NAMES, 1)
        assert steps == {1: A, 2: B, 3: C}
    else:
        assert after == [{"resumed": 1}, {"step": 2, "read": C}, {"step": 3, "read": None}]
        assert consumed == dict.fromkeys(NAMES, 1)  # B marked consumed, never trained: lost
        assert steps is None


@pytest.mark.slow
def test_steps_whose_checkpoint_was_not_saved_yet_are_all_requeued(policy_site, tiny_model, tmp_path):
    """Trinity saves a checkpoint in the background and reads the next step's batch meanwhile: a
    kill after step 2's read while no checkpoint was saved yet (the trainer resumes from 0) gives
    back both batches, read again in order; nothing is read twice after that."""
    cfg = train_yaml(tmp_path, tiny_model)
    first = run_trainer(policy_site, cfg, {"commit": NAMES, "trainer": ["step", "step", "kill"]}, killed=True)
    assert first == [{"resumed": 0}, {"step": 1, "read": A}, {"step": 2, "read": B}]
    after = run_trainer(policy_site, cfg, {"trainer": ["step", "save", "step", "save", "step", "save", "step"]})
    assert after == [{"resumed": 0}, {"step": 1, "read": A}, {"step": 2, "read": B}, {"step": 3, "read": C},
                     {"step": 4, "read": None}]  # fmt: skip
    consumed, steps = store(tmp_path)
    assert consumed == dict.fromkeys(NAMES, 1)
    assert steps == {1: A, 2: B, 3: C}


@pytest.mark.slow
def test_without_a_crash_each_experience_is_read_once(policy_site, tiny_model, tmp_path):
    """Three steps, each checkpoint saved, then a clean restart: each experience read once, by the
    step recorded for it; the restarted trainer (resumed from 3) requeues nothing and finds no batch."""
    cfg = train_yaml(tmp_path, tiny_model)
    first = run_trainer(policy_site, cfg, {"commit": NAMES, "trainer": ["step", "save", "step", "save", "step", "save"]})
    assert first == [{"resumed": 0}, {"step": 1, "read": A}, {"step": 2, "read": B}, {"step": 3, "read": C}]
    after = run_trainer(policy_site, cfg, {"trainer": ["step"]})
    assert after == [{"resumed": 3}, {"step": 4, "read": None}]
    consumed, steps = store(tmp_path)
    assert consumed == dict.fromkeys(NAMES, 1)
    assert steps == {1: A, 2: B, 3: C}


@pytest.mark.slow
def test_switch_off_restores_upstream_and_a_bad_value_is_refused(policy_site, tiny_model, tmp_path):
    """RFTSTACK_SQL_READ_REQUEUE=0: the patched files behave as published (the killed step's batch
    is lost, no side table); another value stops the import with one sentence."""
    cfg = train_yaml(tmp_path, tiny_model)
    off = {"RFTSTACK_SQL_READ_REQUEUE": "0"}
    run_trainer(policy_site, cfg, {"commit": NAMES, "trainer": ["step", "save", "step", "kill"]}, killed=True, env=off)
    after = run_trainer(policy_site, cfg, {"trainer": ["step", "save", "step"]}, env=off)
    assert after == [{"resumed": 1}, {"step": 2, "read": C}, {"step": 3, "read": None}]
    assert store(tmp_path) == (dict.fromkeys(NAMES, 1), None)
    bad = run_python("import sys; sys.path.insert(0, sys.argv[1]); import trinity.buffer.storage.sql", str(policy_site),
                     env={"RFTSTACK_SQL_READ_REQUEUE": "yes"})  # fmt: skip
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == (
        "ValueError: RFTSTACK_SQL_READ_REQUEUE must be 1 (a batch read for a step that no saved checkpoint holds is read "
        "again after a restart, the default) or 0 (upstream: that batch is lost), not 'yes'")



def rows(tmp_path: Path) -> dict[str, dict]:
    """Every row of every table of the store by its first column, as a dict of its columns
    (what "nothing else changes" compares)."""
    con = sqlite3.connect(f"file:{tmp_path / 'ckpt/report/qwen3b/buffer/experience_buffer.db'}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        names = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
        return {n: {tuple(r)[:2] if n.endswith("_reads") else r[0]: dict(r) for r in con.execute(f'select * from "{n}"')}
                for n in names}  # fmt: skip
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["given-back", "not-given-back", "patch-off"])
def test_batch_of_a_step_that_raised_is_read_again_after_the_give_back(policy_site, tiny_model, tmp_path, case):
    """Trinity's trainer catches a step's exception and saves a final checkpoint numbered with that
    step (trinity/trainer/trainer.py `Trainer.train`; verl's counter was raised when the step began):
    here step 1 reads batch A and checkpoint 1 is saved. `rftstack train`'s give-back
    (rftstack.run.train_requeue.settle, for the failed step 1) unconsumes A's rows and drops their read
    records, nothing else in the store changes; the restarted trainer (resumed from 1) reads A for
    step 2, then B and C, each experience consumed once. Without the give-back A is lost (consumed,
    never read again); with the read-requeue patch off (no reads table) the give-back says so and
    changes nothing."""
    from rftstack.run import train_requeue

    cfg = train_yaml(tmp_path, tiny_model)
    env = {"RFTSTACK_SQL_READ_REQUEUE": "0"} if case == "patch-off" else None
    first = run_trainer(policy_site, cfg, {"commit": NAMES, "trainer": ["step", "save"]}, env=env)
    assert first == [{"resumed": 0}, {"step": 1, "read": A}]
    before = rows(tmp_path)
    job = tmp_path / "ckpt/report/qwen3b"
    buf = yaml.safe_load(cfg.read_text())["buffer"]["trainer_input"]["experience_buffer"]
    db = job / "buffer/experience_buffer.db"
    if case == "patch-off":
        done = train_requeue.settle(1, str(job), buf)
        assert done.experiences == 0 and done.note == (
            f"the store {db} has no experience_buffer_reads table (the read-requeue patch is off), so the batch of "
            "the failed step 1 was not given back")  # fmt: skip
        assert rows(tmp_path) == before
        return
    if case == "given-back":
        done = train_requeue.settle(1, str(job), buf)
        assert done == train_requeue.GiveBack(1, 3, str(db), "gave back the 3 experiences of the failed step 1; they are "
                                                             "trained when rftstack train starts again")  # fmt: skip
        after = rows(tmp_path)
        a_ids = {i for i, step in before["experience_buffer_reads"]}
        assert len(a_ids) == 3 and after["experience_buffer_reads"] == {}
        assert {k: v for k, v in after.items() if k != "experience_buffer_reads" and k != "experience_buffer"} == {
            k: v for k, v in before.items() if k != "experience_buffer_reads" and k != "experience_buffer"}  # fmt: skip
        old, new = before["experience_buffer"], after["experience_buffer"]
        assert old.keys() == new.keys()
        assert {i: {**old[i], "consumed": old[i]["consumed"] - (i in a_ids)} for i in old} == new  # A's consumed, nothing else
        assert store(tmp_path) == (dict.fromkeys(NAMES, 0), {})
    after_restart = run_trainer(policy_site, cfg, {"trainer": ["step", "save", "step", "save", "step", "save", "step"]})
    consumed, steps = store(tmp_path)
    assert consumed == dict.fromkeys(NAMES, 1)
    if case == "given-back":
        assert after_restart == [{"resumed": 1}, {"step": 2, "read": A}, {"step": 3, "read": B}, {"step": 4, "read": C},
                                 {"step": 5, "read": None}]  # fmt: skip
        assert steps == {2: A, 3: B, 4: C}
    else:  # A marked consumed by the failed step 1, never trained: lost
        assert after_restart == [{"resumed": 1}, {"step": 2, "read": B}, {"step": 3, "read": C}, {"step": 4, "read": None}]
        assert steps == {1: A, 2: B, 3: C}
