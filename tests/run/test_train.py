"""`rftstack train` supervising a real child (tests/doubles/fake_trinity.py in train mode stands in
for Trinity's verl trainer, which needs a GPU) with real Ray heads: run directory, effective config,
checkpoint events, a failed step, signals, bad input, and the train-side preflight."""

from __future__ import annotations

import json
import signal
import sqlite3
import time

import pytest
import yaml

from rftstack.run import supervisor, train_config
from helpers import experience_reads

pytestmark = pytest.mark.slow


def write_config(tmp_path, model="/models/m", **kw) -> str:
    cfg = train_config.example(model, checkpoint_root_dir=str(tmp_path / "ckpt"), project="p", name="n", train_batch_size=2, total_steps=2, **kw)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def join(head):
    return ["--skip-doctor", "--ray-address", head.address, "--ray-token-path", head.token_path]


def assert_nothing_left(run):
    for tag in run.tags():
        assert supervisor.tagged(tag) == [], f"processes of {tag} left behind"


def test_two_steps_then_finished(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], command="train")
    assert run.wait_event("training", timeout=120), run.finish() or run.stderr
    assert run.finish() == 0, run.stderr
    assert [e["step"] for e in run.events if e["event"] == "checkpoint"][-1] == 2
    st = run.status()
    assert st["phase"] == "stopped" and st["exit_code"] == 0 and st["latest_step"] == 2
    assert st["exit_reason"].startswith("training finished after 2 step(s), latest checkpoint step 2")
    cfg = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert cfg["mode"] == "train" and cfg["cluster"]["ray_address"] == session_head.address
    assert cfg["buffer"]["trainer_input"]["experience_buffer"]["path"] == f"sqlite:///{tmp_path}/ckpt/p/n/buffer/experience_buffer.db"
    keys = {c["key"] for c in json.loads((run.run_dir / "changes.json").read_text())}
    assert {"cluster.ray_address", "buffer.trainer_input.experience_buffer"} <= keys
    assert "Training at step 2 finished" in (run.run_dir / "logs" / "trinity.log").read_text()
    assert (tmp_path / "ckpt/p/n/global_step_2/actor").is_dir()
    assert_nothing_left(run)
    assert session_head.gcs_pid() is not None  # a joined head is not ours to stop


def test_reader_timeout_ends_training_with_its_reason(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], fake="train_no_more", command="train")
    assert run.finish() == 0, run.stderr
    assert run.status()["exit_reason"] == ("training finished after 2 step(s), latest checkpoint step 2 "
                                           "(no full batch arrived within the reader's max_read_timeout)")  # fmt: skip
    assert_nothing_left(run)


def test_a_failed_step_is_a_failure_although_trinity_exits_0(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], fake="train_error", command="train")
    assert run.finish() == 1
    st = run.status()
    assert st["phase"] == "failed" and "the trainer failed a step" in st["exit_reason"]
    assert "simulated step failure" in run.stderr  # the log's tail
    assert run.stderr.index("waiting up to 60 s for Trinity's final checkpoint and exit") < run.stderr.index("Trainer finished")
    note = f"the experience store {tmp_path}/ckpt/p/n/buffer/experience_buffer.db does not exist, so the batch of the failed step 2 was not given back"
    assert note in run.stderr and st["gave_back"] == {"step": 2, "experiences": 0, "store": f"{tmp_path}/ckpt/p/n/buffer/experience_buffer.db", "note": note}
    assert_nothing_left(run)


def test_a_final_save_longer_than_the_stop_timeout_is_interrupted(tmp_path, session_head, serve_runner):
    """Trinity's final save after the error outlasts --stop-timeout: train stops Trinity, so the
    latest checkpoint stays at step 1 and the restart's reader gives step 2's batch back itself."""
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path), "--stop-timeout", "1"], fake="train_error", command="train")
    assert run.finish() == 1
    assert "waiting up to 1 s for Trinity's final checkpoint and exit" in run.stderr and "trinity stopped (SIGINT" in run.stderr
    note = "the latest checkpoint is step 1, so a restart reads for step 2 again and the reader gives its batch back itself"
    assert note in run.stderr and run.status()["gave_back"]["note"] == note
    assert (tmp_path / "ckpt/p/n/latest_checkpointed_iteration.txt").read_text() == "1"
    assert_nothing_left(run)


def test_a_signal_during_the_wait_after_a_failed_step_is_still_a_failure(tmp_path, session_head, serve_runner):
    """SIGTERM while Trinity saves after the error: train stops it and exits 1, not 0."""
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], fake="train_error", command="train")
    assert run.wait_event("training", timeout=120), run.finish() or run.stderr
    deadline = time.monotonic() + 60
    while "waiting up to 60 s for Trinity's final checkpoint" not in run.stderr_text():
        assert time.monotonic() < deadline and run.proc.poll() is None, run.stderr_text()
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 1
    st = run.status()
    assert st["phase"] == "failed" and "the trainer failed a step" in st["exit_reason"] and "then SIGTERM stopped the wait" in st["exit_reason"]
    assert st["gave_back"]["experiences"] == 0
    assert_nothing_left(run)


COMMIT = r"""
import asyncio, sys
import torch
from trinity.buffer.buffer import get_buffer_writer
from trinity.common.config import load_config
from trinity.common.experience import EID, Experience

cfg = load_config(sys.argv[1])
cfg.check_and_update()
sc = cfg.buffer.trainer_input.experience_buffer.to_storage_config()
sc.wrap_in_ray = False


async def main():
    writer = get_buffer_writer(sc)
    for names in (sys.argv[2:4], sys.argv[4:6], sys.argv[6:8]):  # three commits, as the serve's pipeline writes them
        await writer.write([Experience(eid=EID(task=n, suffix=n), tokens=torch.tensor([1, 2, 3, 4]), prompt_length=2,
                                       logprobs=torch.tensor([-0.5, -0.25]), reward=1.0, info={"model_version": 0})
                            for n in names])

asyncio.run(main())
"""


def test_the_batch_of_the_failed_step_is_given_back(tmp_path, session_head, serve_runner, tiny_model):
    """Six experiences written by Trinity's SQL writer (batches of 2); the trainer double reads each
    step's batch with Trinity's real sample strategy and patched SQL reader, step 2 raises and the
    final checkpoint is numbered 2, as Trinity's trainer saves it. Trinity exits 0; train exits 1 and,
    once it stopped, gives step 2's batch back: unconsumed, its read records gone; step 1's stay."""
    from helpers import run_python

    path = write_config(tmp_path, model=str(tiny_model), max_model_len=2048)
    eff, _ = train_config.effective(yaml.safe_load(open(path)), ray_address="127.0.0.1:2", flash_attn=True)
    (tmp_path / "commit.yaml").write_text(yaml.safe_dump(eff))
    names = [f"e{i}" for i in range(6)]
    out = run_python(COMMIT, str(tmp_path / "commit.yaml"), *names)
    assert out.returncode == 0, out.stderr[-3000:]
    run = serve_runner([*join(session_head), "-c", path], fake="train_error,train_reads", command="train")
    assert run.finish() == 1, run.stderr
    db = tmp_path / "ckpt/p/n/buffer/experience_buffer.db"
    sentence = "gave back the 2 experiences of the failed step 2; they are trained when rftstack train starts again"
    assert sentence in run.stderr, run.stderr
    log = (run.run_dir / "logs" / "trinity.log").read_text()
    assert "Sample data for step 2 finished (2 experiences)" in log and "Training at step 1 finished" in log
    st = run.status()
    assert st["phase"] == "failed" and "the trainer failed a step" in st["exit_reason"]
    assert st["gave_back"] == {"step": 2, "experiences": 2, "store": str(db), "note": sentence}
    assert [e for e in run.events if e["event"] == "gave_back"] == [{"event": "gave_back", **st["gave_back"]}]
    assert sentence in (run.run_dir / "logs" / "train.log").read_text()
    assert (tmp_path / "ckpt/p/n/latest_checkpointed_iteration.txt").read_text() == "2"
    assert experience_reads(db) == ({"e0": 0, "e1": 0, "e2": 0, "e3": 0, "e4": 1, "e5": 1}, {1: ["e4", "e5"]})
    assert_nothing_left(run)


def test_sigterm_stops_the_trainer_and_escalates(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path), "--stop-timeout", "6"], fake="train_forever,ignore_sigint", command="train")
    assert run.wait_event("checkpoint", timeout=120), run.finish() or run.stderr
    pids = json.loads((tmp_path / "fake-pids.json").read_text())
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.stderr
    assert "SIGINT, SIGTERM" in run.stderr  # the fake ignores SIGINT: train escalated
    assert not supervisor.alive(pids["trinity"])
    assert run.status()["exit_reason"] == "stopped by SIGTERM"
    assert_nothing_left(run)


@pytest.mark.parametrize(
    "edit, sentence",
    [
        ({"mode": "serve"}, "the config's mode is 'serve', rftstack train runs mode: train"),
        ({"checkpoint_root_dir": None}, "the config has no checkpoint_root_dir; set it to the serve's"),
        ({"continue_from_checkpoint": False}, "continue_from_checkpoint is false, so Trinity would rename the job directory"),
    ],
)
def test_bad_config_is_one_sentence_and_starts_nothing(tmp_path, serve_runner, edit, sentence):
    path = write_config(tmp_path)
    cfg = yaml.safe_load(open(path))
    cfg.update(edit)
    open(path, "w").write(yaml.safe_dump(cfg))
    run = serve_runner(["--skip-doctor", "--num-gpus", "0", "-c", path], command="train")
    assert run.finish() == 2
    assert sentence in run.stderr
    assert run.status()["phase"] == "failed"
    assert_nothing_left(run)


def test_preflight_imports_the_trainer_and_refuses_a_missing_store(tmp_path, tiny_model, serve_runner):
    """The real train-side preflight: Trinity's verl trainer imports here (numpy 2.3), the store a
    serve would have written is not there: FAIL, nothing started, the own head stopped."""
    run = serve_runner(["--num-gpus", "0", "-c", write_config(tmp_path, model=str(tiny_model))], command="train")
    assert run.finish(timeout=600) == 1
    assert "train.trainer_import: Trinity's verl trainer imports (verl 0.8.0, numpy 2.3" in run.stderr
    assert "train.experience_store: The experience store" in run.stderr and "does not exist" in run.stderr
    # no flash_attn here (nor on the GPU host): verl's model gets sdpa; verl's unpad_input is patched
    assert "train.attention: The trainer's model uses attention sdpa; flash_attn is not installed." in run.stderr
    assert "train.unpad" not in run.stderr
    pre = yaml.safe_load((tmp_path / "run0" / "config.preflight.yaml").read_text())
    assert train_config.attn_implementation(pre) == "sdpa"
    assert "preflight failed" in run.status()["exit_reason"]
    assert run.status().get("trinity_pid") is None
    assert_nothing_left(run)


def test_store_schema_check_reads_a_store_without_the_reader_columns(tmp_path):
    from rftstack.doctor.checks import trainside

    db = tmp_path / "s.db"
    con = sqlite3.connect(db)
    con.execute("create table experience_buffer (id integer primary key, reward real)")
    con.commit()
    con.close()
    exists, missing = trainside.store_tables(db, "experience_buffer")
    assert exists and missing == ["experience_buffer_blob", "experience_buffer.consumed", "experience_buffer.model_version"]
    (f,) = trainside.check_store(db, "experience_buffer", exists, missing)
    assert f.status == "fail" and "lacks experience_buffer_blob" in f.message
