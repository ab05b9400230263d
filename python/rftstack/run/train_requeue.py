"""Give back the batch of a training step that raised, so that the next trainer trains it.

Trinity's trainer (trinity/trainer/trainer.py ``Trainer.train``) catches an exception of a step,
logs ``Error in Trainer``, leaves its loop and still saves a final checkpoint. verl's step counter
was raised when the step began (trinity/trainer/verl/trainer.py ``VERLTrainer.train_step``), so that
checkpoint carries the failed step's number: a restart resumes there and reads for the next step,
and the SQL reader's requeue (patches/trinity-sql-read-requeue.patch) gives back only the rows read
for that next step or later. The failed step's batch would stay consumed, never trained.

After Trinity stopped, ``rftstack train`` calls :func:`settle`: when the step that raised is the one
the latest checkpoint holds, the rows the patched reader recorded for it (``<table>_reads``) are
unconsumed again (``consumed - 1`` per record) and their records dropped, in one transaction, as the
patched reader does for a restarted trainer's later steps.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from pathlib import Path

SQLITE_URL = re.compile(r"^sqlite(\+\w+)?:///(?P<path>[^?]*)")
BUSY_TIMEOUT_S = 30.0  # a serve may be writing to the same store


@dataclasses.dataclass(frozen=True)
class GiveBack:
    """What was done with the failed step's batch: ``experiences`` rows given back (0: none) and
    ``note``, one sentence for the user."""

    step: int | None
    experiences: int
    store: str | None
    note: str


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` url (Trinity's ``path`` of an SQL storage), else None."""
    m = SQLITE_URL.match(url.strip())
    if not m or m.group("path") in ("", ":memory:"):
        return None
    return Path(m.group("path"))


def step_to_give_back(failed_step: int | None, checkpoint_step: int | None) -> tuple[int | None, str]:
    """Whose batch to give back: the step that raised if the latest checkpoint carries its number,
    else None; and why not, in a sentence (empty when there is a step).

    ``failed_step`` is the step whose training started and did not finish when the error came (None
    when the error came outside a training step: its batch was trained, or not read yet).
    ``checkpoint_step`` is ``latest_checkpointed_iteration.txt``, the step a restart resumes from."""
    if failed_step is None:
        return None, ("the error came outside a training step (its batch was trained, or the next one was "
                      "not read yet), so no batch was given back")  # fmt: skip
    if checkpoint_step is None or checkpoint_step < failed_step:
        held = "no checkpoint" if checkpoint_step is None else f"the latest checkpoint is step {checkpoint_step}"
        return None, (f"{held}, so a restart reads for step {failed_step} again and the reader gives its batch "
                      "back itself")  # fmt: skip
    if checkpoint_step > failed_step:
        return None, (f"the latest checkpoint is step {checkpoint_step}, past the failed step {failed_step}, so "
                      "no batch was given back")  # fmt: skip
    return failed_step, ""


def give_back(db: Path, table: str, step: int) -> int | None:
    """Unconsume the rows recorded in ``<table>_reads`` for ``step`` or later (``consumed - 1`` per
    record) and drop those records, in one transaction; how many rows, or None when the store has no
    reads table (the read-requeue patch is off or not applied)."""
    reads = f"{table}_reads"
    con = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            if con.execute("select 1 from sqlite_master where type = 'table' and name = ?", (reads,)).fetchone() is None:
                con.execute("ROLLBACK")
                return None
            counts = con.execute(f'select id, count(*) from "{reads}" where step >= ? group by id', (step,)).fetchall()
            con.executemany(f'update "{table}" set consumed = consumed - ? where id = ?', [(n, row) for row, n in counts])
            con.execute(f'delete from "{reads}" where step >= ?', (step,))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return len(counts)
    finally:
        con.close()


def latest_checkpoint(job_dir: str) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt`` (what verl resumes from), or None."""
    try:
        return int(Path(job_dir, "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None


def settle(failed_step: int | None, job_dir: str, store: dict) -> GiveBack:
    """After a trainer error, with Trinity stopped: give back the failed step's batch if no restart
    would read it again. ``store`` is the effective ``buffer.trainer_input.experience_buffer``."""
    checkpoint = latest_checkpoint(job_dir)
    step, why = step_to_give_back(failed_step, checkpoint)
    if step is None:
        return GiveBack(None, 0, None, why)
    url = str(store.get("path") or "")
    db = sqlite_file(url)
    if db is None:
        return GiveBack(step, 0, url, f"the experience store {url} is not an SQLite file, so the batch of the failed "
                                      f"step {step} was not given back; it stays consumed")  # fmt: skip
    if not db.is_file():
        return GiveBack(step, 0, str(db), f"the experience store {db} does not exist, so the batch of the failed step "
                                          f"{step} was not given back")  # fmt: skip
    table = str(store.get("name") or "experience_buffer")
    try:
        n = give_back(db, table, step)
    except sqlite3.Error as exc:
        return GiveBack(step, 0, str(db), f"giving back the batch of the failed step {step} in {db} failed ({exc}); it "
                                          "stays consumed")  # fmt: skip
    if n is None:
        return GiveBack(step, 0, str(db), f"the store {db} has no {table}_reads table (the read-requeue patch is off), "
                                          f"so the batch of the failed step {step} was not given back")  # fmt: skip
    if n == 0:
        return GiveBack(step, 0, str(db), f"no reads were recorded for the failed step {step}, so nothing was given back")
    them = "experience" if n == 1 else "experiences"
    return GiveBack(step, n, str(db), f"gave back the {n} {them} of the failed step {step}; they are trained when "
                                      "rftstack train starts again")  # fmt: skip
