"""`rftstack train` supervising a real child (tests/doubles/fake_trinity.py in train mode stands in
for Trinity's verl trainer, which needs a GPU) with real Ray heads: run directory, effective config,
checkpoint events, a failed step, signals, bad input, and the train-side preflight."""

from __future__ import annotations

import json
import signal
import sqlite3

import pytest
import yaml

from rftstack.run import supervisor, train_config

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
