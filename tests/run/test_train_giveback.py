"""The decisions of rftstack.run.train_requeue (which failed step's batch to give back, which store
is an SQLite file). The give-back on a store Trinity wrote and read is in
tests/stack/test_train_requeue.py; through `rftstack train` in tests/run/test_train.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rftstack.run import train_requeue


@pytest.mark.parametrize(
    "failed, checkpoint, step, why",
    [
        (2, 2, 2, ""),
        (None, 2, None, "the error came outside a training step (its batch was trained, or the next one was not read yet), "
                        "so no batch was given back"),  # fmt: skip
        (2, 1, None, "the latest checkpoint is step 1, so a restart reads for step 2 again and the reader gives its batch back itself"),
        (1, None, None, "no checkpoint, so a restart reads for step 1 again and the reader gives its batch back itself"),
        (2, 3, None, "the latest checkpoint is step 3, past the failed step 2, so no batch was given back"),
    ],
)
def test_which_step_is_given_back(failed, checkpoint, step, why):
    """Only when the final checkpoint carries the failed step's number: a restart would skip it."""
    assert train_requeue.step_to_give_back(failed, checkpoint) == (step, why)


@pytest.mark.parametrize(
    "url, path",
    [
        ("sqlite:////abs/buffer/experience_buffer.db", Path("/abs/buffer/experience_buffer.db")),
        ("sqlite+aiosqlite:////abs/e.db?timeout=5", Path("/abs/e.db")),
        ("sqlite:///rel.db", Path("rel.db")),
        ("sqlite:///:memory:", None),
        ("postgresql://user@host/db", None),
        ("", None),
    ],
)
def test_sqlite_file_of_a_storage_path(url, path):
    assert train_requeue.sqlite_file(url) == path


def test_a_store_that_is_not_sqlite_is_left_alone(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    done = train_requeue.settle(2, str(tmp_path), {"storage_type": "sql", "path": "postgresql://u@h/db", "name": "experience_buffer"})
    assert done == train_requeue.GiveBack(2, 0, "postgresql://u@h/db", "the experience store postgresql://u@h/db is not an SQLite "
                                          "file, so the batch of the failed step 2 was not given back; it stays consumed")  # fmt: skip
