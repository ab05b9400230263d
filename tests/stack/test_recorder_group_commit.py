"""Group commit in Trinity's experience recorder (patches/trinity-recorder-group-commit.patch).

Real: Trinity 0.6.0's proxy app (app.py, with the policy's feedback patch, as in
tests/stack/test_proxy_bad_requests.py), ExplorerService.record_experience, its HistoryRecorder with the
group-commit patch applied to a private copy of recorder.py, SQLAlchemy, aiosqlite and an SQLite file.
TEST DOUBLES: the upstream vLLM server (in-process ASGI app, a new response id per request; the one
of tests/stack/test_store_full.py) and the service's model allocation. Failures are made by SQLite itself:
a trigger that refuses some rows, another connection holding the write lock.

Transactions are counted with SQLAlchemy's own "commit" event on the recorder's engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
import sys
from pathlib import Path

import pytest

from rftstack.stack import patches
from rftstack.stack import policy

httpx = pytest.importorskip("httpx")
from sqlalchemy import event  # noqa: E402

from proxy_helpers import Service, load_app
from proxy_helpers import upstream

VAR = "RFTSTACK_RECORDER_GROUP_COMMIT"
REL = "trinity/explorer/proxy/recorder.py"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


def the_patch():
    (p,) = [p for p in policy.load().patches if p.file == "trinity-recorder-group-commit.patch"]
    return p


@pytest.fixture(scope="module")
def recorder_mod(tmp_path_factory):
    """Trinity's recorder.py with the policy's group-commit patch, as a private module (whatever the
    environment's `rftstack relax` did to the installed one)."""
    import trinity

    text = (Path(trinity.__file__).parents[1] / REL).read_text()
    (fp,) = patches.parse((patches.patches_dir() / the_patch().file).read_text())
    text = patches.undo(text, patches.patches_dir() / the_patch().file, REL)  # start from the original
    assert "GROUP_COMMIT_VAR" not in text
    text = patches.apply_text(text, fp)[0]
    path = tmp_path_factory.mktemp("recorder") / "recorder_group_commit.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("recorder_group_commit", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def new_recorder(recorder_mod, db: Path, monkeypatch, group: str | None):
    if group is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, group)
    return recorder_mod.HistoryRecorder(db_url=f"sqlite:///{db}", table_name="proxy_history")


def count_commits(rec) -> list[int]:
    """One entry per database transaction committed by ``rec`` (after prepare())."""
    commits: list[int] = []
    event.listen(rec.session.kw["bind"].sync_engine, "commit", lambda conn: commits.append(1))
    return commits


def rows(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        got = [m for (m,) in con.execute("select h.msg_id from proxy_history h join proxy_history_blob b on b.id = h.id")]
        assert con.execute("select count(*) from proxy_history_blob").fetchone()[0] == len(got)  # no blob without meta
        return got
    finally:
        con.close()


def has_row(db: Path, msg_id: str) -> bool:
    con = sqlite3.connect(db)
    try:
        return con.execute("select count(*) from proxy_history h join proxy_history_blob b on b.id = h.id "
                           "where h.msg_id = ?", (msg_id,)).fetchone()[0] == 1
    finally:
        con.close()


def experience(msg_id: str):
    import torch
    from trinity.common.experience import Experience

    exp = Experience(tokens=torch.tensor(list(range(1, 65)), dtype=torch.int32), logprobs=torch.full((32,), -0.5),
                     prompt_length=32)
    exp.eid.suffix = msg_id
    exp.info["model_version"] = 0
    return exp


def refuse(db: Path, msg_id_like: str) -> None:
    """SQLite itself refuses every meta row whose msg_id is LIKE the pattern (a trigger)."""
    con = sqlite3.connect(db)
    con.execute(f"create trigger refuse before insert on proxy_history when new.msg_id like '{msg_id_like}' "
                "begin select raise(abort, 'refused by the test trigger'); end")
    con.commit()
    con.close()


def allow(db: Path) -> None:
    con = sqlite3.connect(db)
    con.execute("drop trigger refuse")
    con.commit()
    con.close()


# ---- through the real proxy app ------------------------------------------------------------------

async def chat_concurrently(app_mod, service, n: int, db: Path) -> list[tuple[int, str | None, bool]]:
    """``n`` concurrent chat completions; per response (status, id, its row committed on arrival)."""
    app = app_mod.app
    app.state.service, app.state.temperature, app.state.inference_timeout = service, 1.0, 30
    app.state.models_cache = None
    app.state.http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream()))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=60) as c:
            async def one() -> tuple[int, str | None, bool]:
                r = await c.post("/v1/chat/completions", json=CHAT)
                rid = r.json()["id"] if r.status_code == 200 else None
                # checked at once (synchronously: nothing else runs in this loop meanwhile)
                return r.status_code, rid, bool(rid) and has_row(db, rid)
            return list(await asyncio.gather(*(one() for _ in range(n))))
    finally:
        await app.state.http_client.aclose()


def proxy_service(recorder_mod, tmp_path, monkeypatch, group: str | None):
    app_mod, service_mod = load_app(True, tmp_path)
    db = tmp_path / "proxy_history.db"
    service = Service(service_mod, db)
    service.recorder = new_recorder(recorder_mod, db, monkeypatch, group)
    return app_mod, service, db


@pytest.mark.parametrize("group", [None, "1"])
def test_concurrent_responses_each_committed_before_it_is_returned(recorder_mod, tmp_path, monkeypatch, group):
    app_mod, service, db = proxy_service(recorder_mod, tmp_path, monkeypatch, group)

    async def scenario():
        await service.recorder.prepare()
        commits = count_commits(service.recorder)
        return await chat_concurrently(app_mod, service, 64, db), len(commits)

    got, commits = asyncio.run(scenario())
    assert [s for s, _, _ in got] == [200] * 64
    ids = [rid for _, rid, _ in got]
    assert len(set(ids)) == 64
    assert all(on_arrival for _, _, on_arrival in got)  # never returned before its row was committed
    assert sorted(rows(db)) == sorted(ids)  # exactly one row (meta + blob) per response
    assert commits < 32, f"{commits} transactions for 64 concurrent responses: no grouping happened"
    print(f"64 concurrent responses, {commits} transactions")


def test_variable_0_gives_upstream_one_transaction_per_response(recorder_mod, tmp_path, monkeypatch):
    app_mod, service, db = proxy_service(recorder_mod, tmp_path, monkeypatch, "0")

    async def scenario():
        await service.recorder.prepare()
        commits = count_commits(service.recorder)
        return await chat_concurrently(app_mod, service, 64, db), len(commits)

    got, commits = asyncio.run(scenario())
    assert [s for s, _, _ in got] == [200] * 64 and all(ok for _, _, ok in got)
    assert sorted(rows(db)) == sorted(rid for _, rid, _ in got)
    assert commits == 64  # upstream's write path: one session and transaction per response
    assert service.recorder._writer is None  # the group-commit writer never started


def test_a_refused_batch_answers_500_to_all_its_requests_and_the_next_ones_work(recorder_mod, tmp_path, monkeypatch):
    app_mod, service, db = proxy_service(recorder_mod, tmp_path, monkeypatch, None)

    async def scenario():
        await service.recorder.prepare()
        refuse(db, "%")
        failed = await chat_concurrently(app_mod, service, 16, db)
        allow(db)
        return failed, await chat_concurrently(app_mod, service, 16, db)

    failed, after = asyncio.run(scenario())
    assert [s for s, _, _ in failed] == [500] * 16  # Trinity's answer when recording fails, as it is
    assert [s for s, _, _ in after] == [200] * 16 and all(ok for _, _, ok in after)
    assert sorted(rows(db)) == sorted(rid for _, rid, _ in after)


@pytest.mark.parametrize("group,says", [(None, "group commit (RFTSTACK_RECORDER_GROUP_COMMIT=1"), ("0", "one transaction per call (RFTSTACK_RECORDER_GROUP_COMMIT=0")])
def test_the_log_says_which_write_path(recorder_mod, tmp_path, monkeypatch, caplog, group, says):
    """So a serve run's trinity.log shows whether the variable reached the Explorer actor."""
    import logging

    rec = new_recorder(recorder_mod, tmp_path / "x.db", monkeypatch, group)
    rec.logger.addHandler(caplog.handler)  # Trinity's loggers do not propagate to the root
    try:
        with caplog.at_level(logging.INFO):
            asyncio.run(rec.prepare())
    finally:
        rec.logger.removeHandler(caplog.handler)
    assert any(f"Recorder writes: {says}" in r.getMessage() for r in caplog.records), caplog.text


def test_bad_value_is_one_sentence(recorder_mod, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"RFTSTACK_RECORDER_GROUP_COMMIT must be 1 .* or 0 .*, not 'yes'"):
        new_recorder(recorder_mod, tmp_path / "x.db", monkeypatch, "yes")


# ---- the recorder's batches, failures and cancellations ------------------------------------------

def test_a_failing_batch_fails_every_caller_in_it_and_the_next_batch_works(recorder_mod, tmp_path, monkeypatch):
    """One refused row fails its whole batch: every caller of that batch gets the error (the batch is
    one transaction); calls queued in the same loop step form one batch."""
    from sqlalchemy.exc import IntegrityError

    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")

    async def scenario():
        await rec.prepare()
        commits = count_commits(rec)
        refuse(db, "poison%")
        first = await asyncio.gather(*(rec.record_history([experience(f"a{i}")]) for i in range(7)),
                                     rec.record_history([experience("poison")]), return_exceptions=True)
        second = await asyncio.gather(*(rec.record_history([experience(f"b{i}")]) for i in range(8)), return_exceptions=True)
        alone = await asyncio.gather(rec.record_history([experience("poison")]), return_exceptions=True)
        return first, second, alone, len(commits)

    first, second, alone, commits = asyncio.run(scenario())
    assert all(isinstance(e, IntegrityError) and "refused by the test trigger" in str(e) for e in first), first
    assert len({id(e) for e in first}) == 8  # each caller its own exception object (its own traceback)
    assert second == [None] * 8
    assert isinstance(alone[0], IntegrityError)
    assert sorted(rows(db)) == sorted(f"b{i}" for i in range(8))  # nothing of the failed batch, all of the next
    assert commits == 1  # the second batch was one transaction


def test_ids_are_checked_before_any_blob_is_written(recorder_mod, tmp_path, monkeypatch):
    """The batch reads its rows' ids back (the last ones of the table); a row that is not the batch's
    among them (here: a trigger inserts one in the middle) fails the batch, and nothing is recorded,
    rather than a blob being stored under another row's id."""
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")

    async def scenario():
        await rec.prepare()
        con = sqlite3.connect(db)
        con.execute("create trigger intrude after insert on proxy_history when new.msg_id = 'g1' "
                    "begin insert into proxy_history (msg_id, consumed) values ('intruder', 0); end")
        con.commit()
        first = await asyncio.gather(*(rec.record_history([experience(f"g{i}")]) for i in range(3)), return_exceptions=True)
        con.execute("drop trigger intrude")
        con.commit()
        con.close()
        return first, await asyncio.gather(*(rec.record_history([experience(f"h{i}")]) for i in range(3)))

    first, second = asyncio.run(scenario())
    assert all(isinstance(e, RuntimeError) and "not the table's last ones" in str(e) for e in first), first
    assert second == [None] * 3
    assert sorted(rows(db)) == ["h0", "h1", "h2"]
    con = sqlite3.connect(db)
    assert con.execute("select count(*) from proxy_history").fetchone()[0] == 3  # the failed batch left nothing
    con.close()


def test_variable_0_fails_only_the_refused_call(recorder_mod, tmp_path, monkeypatch):
    """Upstream's behaviour for comparison: each call is its own transaction."""
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "0")

    async def scenario():
        await rec.prepare()
        refuse(db, "poison%")
        return await asyncio.gather(*(rec.record_history([experience(f"a{i}")]) for i in range(3)),
                                    rec.record_history([experience("poison")]), return_exceptions=True)

    got = asyncio.run(scenario())
    assert got[:3] == [None] * 3 and isinstance(got[3], Exception)
    assert sorted(rows(db)) == ["a0", "a1", "a2"]


@pytest.mark.parametrize("spoil", ["unpicklable info (serialize fails)", "info not a dict (the row cannot be made)"])
def test_an_experience_that_cannot_become_a_row_fails_alone(recorder_mod, tmp_path, monkeypatch, spoil):
    """Failures before SQLite (serializing, building the row) stay with their own call."""
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")
    bad = experience("bad")
    if spoil.startswith("unpicklable"):
        bad.info["callback"] = lambda: None
    else:
        bad.info = ["model_version", 0]

    async def scenario():
        await rec.prepare()
        return await asyncio.gather(*(rec.record_history([experience(f"g{i}")]) for i in range(3)),
                                    rec.record_history([bad]), return_exceptions=True)

    got = asyncio.run(scenario())
    assert got[:3] == [None] * 3 and isinstance(got[3], Exception), got
    assert sorted(rows(db)) == ["g0", "g1", "g2"]


async def queued_calls(rec, prefix: str, n: int) -> list:
    """n record_history calls started; after one turn of the loop each has queued its experiences
    and the writer has not committed yet."""
    tasks = [asyncio.create_task(rec.record_history([experience(f"{prefix}{i}")])) for i in range(n)]
    await asyncio.sleep(0)
    return tasks


def test_cancelled_callers_neither_lose_nor_block_the_others(recorder_mod, tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")

    async def scenario():
        await rec.prepare()
        tasks = await queued_calls(rec, "c", 32)
        assert not any(t.done() for t in tasks)
        for t in tasks[::2]:
            t.cancel()  # as Starlette cancels a handler whose client went away
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        later = await asyncio.wait_for(rec.record_history([experience("after")]), timeout=30)
        return done, later

    done, later = asyncio.run(scenario())
    assert all(isinstance(d, asyncio.CancelledError) for d in done[::2])
    assert done[1::2] == [None] * 16 and later is None
    # the cancelled callers' rows were committed with their batch: nothing lost, nothing twice
    assert sorted(rows(db)) == sorted([f"c{i}" for i in range(32)] + ["after"])


def test_writer_cancelled_mid_commit_fails_its_callers_and_the_next_call_restarts_it(recorder_mod, tmp_path, monkeypatch):
    """The writer task is cancelled (what an event loop's shutdown does) while its commit waits for
    SQLite's write lock: its callers get an error at once instead of hanging; the next call starts a
    new writer."""
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")

    async def scenario():
        await rec.prepare()
        await rec.record_history([experience("before")])
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("begin exclusive")  # another writer holds the lock: the batch's insert waits
        try:
            tasks = await queued_calls(rec, "w", 8)
            await asyncio.sleep(0.5)
            writer = rec._writer
            assert writer is not None and not writer.done() and not any(t.done() for t in tasks)
            writer.cancel()
            got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        finally:
            lock.execute("rollback")
            lock.close()
        await asyncio.wait_for(rec.record_history([experience("after")]), timeout=30)
        return got, writer, rec._writer

    got, old, new = asyncio.run(scenario())
    assert all(isinstance(e, RuntimeError) and "writer stopped before" in str(e) for e in got), got
    assert new is not old and new.done() and old.cancelled()
    assert {"before", "after"} <= set(rows(db))


def test_writer_cancelled_before_it_ran_fails_its_callers(recorder_mod, tmp_path, monkeypatch):
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")

    async def scenario():
        await rec.prepare()
        tasks = await queued_calls(rec, "n", 4)  # the writer task exists but has not run
        writer = rec._writer
        writer.cancel()
        got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
        await rec.record_history([experience("after")])
        return got, writer

    got, writer = asyncio.run(scenario())
    assert writer.cancelled()
    assert all(isinstance(e, RuntimeError) and "cancelled before it ran" in str(e) for e in got), got
    assert rows(db) == ["after"]


def test_event_loop_shutdown_with_calls_in_flight_ends_cleanly(recorder_mod, tmp_path, monkeypatch):
    """asyncio.run returning while record_history calls are queued: it cancels them and the writer;
    nothing hangs and nothing is reported as a never-retrieved exception."""
    db = tmp_path / "h.db"
    rec = new_recorder(recorder_mod, db, monkeypatch, "1")
    reports: list[dict] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reports.append(ctx))
        await rec.prepare()
        for i in range(16):
            asyncio.create_task(rec.record_history([experience(f"s{i}")]))
        await asyncio.sleep(0)  # queued, writer started, nothing committed yet

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    import gc

    gc.collect()  # never-retrieved exceptions are reported when their future is collected
    assert reports == []
    assert set(rows(db)) <= {f"s{i}" for i in range(16)}  # all or none of a batch; no stray rows
