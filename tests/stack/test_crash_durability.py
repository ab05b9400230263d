"""kill -9 of the process that runs Trinity's proxy loses nothing already recorded.

The proxy, its `HistoryRecorder` (SQLite, table proxy_history + proxy_history_blob) and
ExplorerService's record/feedback/commit code are Trinity's real code with the policy's stream
patch (tests/doubles/trinity_proxy_host.py, started as in test_proxy_stream.py); upstream is the
vLLM 0.23.0 TEST DOUBLE (tests/doubles/vllm_stream_double.py), and the Explorer behind /commit is
a TEST DOUBLE writing each committed experience to a JSON-lines file. After the SIGKILL the SQLite
file is read directly (sqlite3 + Trinity's own `Experience.deserialize`).

Each test on the full patch set runs with the experiences built on the proxy's loop and with 2 builder
processes (patches/trinity-proxy-build-processes.patch; fixture `builders`).

What "recorded" means here: the client got the response (HTTP 200, or a stream through [DONE])
or the /feedback or /commit answer. A request cut off by the kill may or may not have a row.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from proxy_helpers import Proxy, assert_intact, post, stored

N = 12
BUILD_VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"  # patches/trinity-proxy-build-processes.patch


@pytest.fixture(params=["0", "2"], ids=["loop", "builders"])
def builders(request, monkeypatch, tmp_path):
    """The tests on the policy's full patch set run twice: with the experiences built on the proxy's loop (0:
    upstream's building, the default below 4 CPUs, so CI's) and with 2 builder processes (the default `auto` of
    an 8-CPU host; 4 on the GPU host's 16). Each proxy's log must say which it had."""
    monkeypatch.setenv(BUILD_VAR, request.param)
    yield int(request.param)
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("proxy*.log"))
    said = f"Experience builders: 2 processes ({BUILD_VAR}=2, rftstack patch)"
    assert (said in logs) == (request.param == "2"), f"the proxies' logs under {tmp_path} do not match {BUILD_VAR}={request.param}"


def kill9(px: Proxy) -> None:
    """SIGKILL the proxy host's whole process group, no grace."""
    if px.proc.poll() is None:
        os.killpg(px.proc.pid, signal.SIGKILL)
    px.proc.wait()


@pytest.fixture
def next_proxy():
    """Starts a test's next proxy process ahead (``Proxy(held=True)``): it imports Trinity (most of a
    proxy's start) while the one before it runs, and opens the shared store only on ``release()``,
    after that one's kill. Each is killed at the end, also when the test fails before its turn."""
    held: list[Proxy] = []

    def start(*args, **kwargs) -> Proxy:
        held.append(Proxy(*args, held=True, **kwargs))
        return held[-1]

    yield start
    for px in held:
        kill9(px)


def ask(px: Proxy, i: int, max_tokens: int) -> str:
    """One chat completion, streamed for odd i; its id once the client has the whole response."""
    content = f"crash case {i}"
    if i % 2:
        return px.stream(content, max_tokens=max_tokens)[0]  # the openai client read through [DONE]
    r = px.client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens)
    return r.id


def commits(px: Proxy) -> list[dict]:
    return [json.loads(line) for line in px.commits.read_text().splitlines()] if px.commits.exists() else []


def test_kill9_after_feedback_and_commit_keeps_every_response_reward_and_commit(double, patched_site, tmp_path):
    px = Proxy(double.base_url, tmp_path / "proxy", patched_site)
    try:
        ids = [ask(px, i, max_tokens=3 + i) for i in range(N)]  # 6 plain, 6 streamed
        reward = {rid: round(0.1 * (k + 1), 3) for k, rid in enumerate(ids)}
        committed, only_rewarded = ids[:6], ids[6:]
        for rid in committed:
            assert post(px.base + "/feedback", {"reward": reward[rid], "msg_ids": [rid], "task_id": "crash", "run_id": 0})["status"] == "success"
        assert post(px.base + "/commit", {})["status"] == "success"
        for rid in only_rewarded:  # rewarded, then the process dies before any /commit
            assert post(px.base + "/feedback", {"reward": reward[rid], "msg_ids": [rid], "task_id": "crash", "run_id": 0})["status"] == "success"
        kill9(px)  # right after the last HTTP answer
    finally:
        kill9(px)
    assert px.proc.returncode == -signal.SIGKILL

    check, rows = stored(px.db)
    assert check == "ok"
    assert sorted(rows) == sorted(ids)  # no row lost, none extra
    for rid in ids:
        assert len(rows[rid]) == 1, f"{rid} has {len(rows[rid])} rows"
        (row,) = rows[rid]
        assert_intact(row, double.sent[rid])
        assert row["reward"] == pytest.approx(reward[rid]) and row["consumed"] == 1 and row["task"] == "crash"

    got = commits(px)
    assert sorted(c["msg_id"] for c in got) == sorted(committed)  # each committed one exactly once, nothing else
    for c in got:
        sent = double.sent[c["msg_id"]]
        assert c["reward"] == pytest.approx(reward[c["msg_id"]])
        assert c["prompt_token_ids"] == sent["prompt_token_ids"] and c["token_ids"] == sent["token_ids"]


def test_kill9_mid_burst_keeps_every_response_the_client_received(double, patched_site, tmp_path):
    """16 concurrent requests (8 plain, 8 streamed with up to 40 slow tokens); SIGKILL once 6
    responses are in the client's hands, while streams are still being sent."""
    px = Proxy(double.base_url, tmp_path / "proxy", patched_site)
    double.token_delay_s = 0.1
    received, failed = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futs = [pool.submit(ask, px, i, 4 + 2 * i if i % 2 else 4) for i in range(16)]
            for f in concurrent.futures.as_completed(futs):
                try:
                    received.append(f.result())
                except Exception as e:  # noqa: BLE001 - a request the kill cut off
                    failed.append(repr(e))
                if len(received) == 6 and px.proc.poll() is None:
                    kill9(px)
    finally:
        double.token_delay_s = 0.0
        kill9(px)
    assert px.proc.returncode == -signal.SIGKILL
    assert failed, "every request finished before the kill: the crash did not happen mid-burst"
    assert len(received) + len(failed) == 16

    check, rows = stored(px.db)
    assert check == "ok"
    for rid in received:
        assert len(rows.get(rid, [])) == 1, f"{rid} reached the client but has {len(rows.get(rid, []))} rows"
        assert_intact(rows[rid][0], double.sent[rid])
    for rid, rs in rows.items():  # the cut-off ones may have a row; any row there is whole
        assert len(rs) == 1
        assert_intact(rs[0], double.sent[rid])


def feedback(px: Proxy, rid: str, reward: float) -> None:
    assert post(px.base + "/feedback", {"reward": reward, "msg_ids": [rid], "task_id": "crash", "run_id": 0})["status"] == "success"


def test_restart_after_kill9_mid_burst_continues_the_same_store(double, policy_site, tmp_path, next_proxy, builders):
    """A new proxy process on the same proxy_history.db and experience buffer (what a restarted
    `rftstack serve` with the same checkpoint root gets) after a kill -9 mid-burst: every response
    the client received, before or after the restart, has exactly one row; the msg ids are unique
    across the restart; rewards and the one /commit after the restart deliver each exactly once."""
    work = tmp_path / "proxy"
    px2 = next_proxy(double.base_url, work, policy_site)  # same db, same commits file, once released
    px = Proxy(double.base_url, work, policy_site)
    double.token_delay_s = 0.1
    before, failed = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futs = [pool.submit(ask, px, i, 4 + 2 * i if i % 2 else 4) for i in range(12)]
            for f in concurrent.futures.as_completed(futs):
                try:
                    before.append(f.result())
                except Exception as e:  # noqa: BLE001 - cut off by the kill
                    failed.append(repr(e))
                if len(before) == 4 and px.proc.poll() is None:
                    kill9(px)
    finally:
        double.token_delay_s = 0.0
        kill9(px)
    assert failed, "the kill did not cut any request off"
    _, rows_before = stored(px.db)

    px2.release()
    try:
        after = [ask(px2, 100 + i, max_tokens=3) for i in range(6)]
        received = before + after
        reward = {rid: round(0.01 * (k + 1), 3) for k, rid in enumerate(received)}
        for rid in received:
            feedback(px2, rid, reward[rid])
        assert post(px2.base + "/commit", {})["status"] == "success"
    finally:
        px2.stop()
    check, rows = stored(px2.db)
    assert check == "ok"
    assert len(set(received)) == len(received)  # msg ids unique across the restart
    for rid in received:
        assert len(rows[rid]) == 1, f"{rid} has {len(rows[rid])} rows"
        assert_intact(rows[rid][0], double.sent[rid])
        assert rows[rid][0]["consumed"] == 2 and rows[rid][0]["reward"] == pytest.approx(reward[rid])
    assert set(rows_before) <= set(rows)  # nothing recorded before the kill is gone
    got = [c["msg_id"] for c in commits(px2)]
    assert sorted(got) == sorted(received)  # each delivered exactly once


@pytest.mark.parametrize("marks", [True, False], ids=["patched", "unpatched"])
def test_rewards_stranded_by_a_crash_are_delivered_once_after_restart(double, policy_site, site_without_marks, tmp_path, marks,
                                                                      next_proxy, builders):  # fmt: skip
    """4 responses rewarded and committed, 4 more rewarded, then kill -9 before any /commit. The
    next process on the same store queues the 4 stranded ones at start and its /commit delivers
    them, once; a third process delivers nothing again. Without the commit-marks patch (Trinity
    0.6.0 as published) the stranded rewards are never delivered: this test fails there."""
    site = policy_site if marks else site_without_marks
    work = tmp_path / "proxy"
    px2 = next_proxy(double.base_url, work, site)
    px3 = next_proxy(double.base_url, work, site) if marks else None  # the third process runs with the patch only
    px = Proxy(double.base_url, work, site)
    try:
        ids = [ask(px, i, max_tokens=3) for i in range(8)]
        first, stranded = ids[:4], ids[4:]
        for rid in first:
            feedback(px, rid, 1.0)
        assert post(px.base + "/commit", {})["status"] == "success"
        for rid in stranded:
            feedback(px, rid, 0.5)
        kill9(px)
    finally:
        kill9(px)
    assert sorted(c["msg_id"] for c in commits(px)) == sorted(first)

    px2.release()
    try:
        assert post(px2.base + "/commit", {})["status"] == "success"
    finally:
        kill9(px2)
    delivered = [c["msg_id"] for c in commits(px2)]
    if not marks:
        assert sorted(delivered) == sorted(first), "unpatched Trinity delivered the stranded rewards"
        return
    assert "RESTORED 4" in px2.log.read_text()
    assert sorted(delivered) == sorted(ids)  # the stranded 4 once, the first 4 not again
    assert all(c["reward"] == 0.5 for c in commits(px2) if c["msg_id"] in stranded)

    assert px3 is not None
    px3.release()
    try:
        assert "RESTORED 0" in px3.log.read_text()
        assert post(px3.base + "/commit", {})["status"] == "success"
    finally:
        px3.stop()
    assert sorted(c["msg_id"] for c in commits(px3)) == sorted(ids)  # nothing delivered twice
    _, rows = stored(px3.db)
    assert {rid: rows[rid][0]["consumed"] for rid in ids} == {rid: 2 for rid in ids}


def buffer_ids(db: Path) -> list[str]:
    """The msg_ids in the SQLite experience buffer (Trinity's SQLExperienceStorage table), in row order."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [m for (m,) in con.execute("select msg_id from experience_buffer order by id")]
    except sqlite3.OperationalError as exc:  # the table is made by the first write
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()


def consumed(db: Path) -> dict[str, int]:
    _, rows = stored(db)
    return {rid: rs[0]["consumed"] for rid, rs in rows.items()}


@pytest.mark.parametrize(("point", "pending"), [("after-write", True), ("before-write", True), ("after-write", False)],
                         ids=["after-write", "before-write", "after-write-pending-off"])  # fmt: skip
def test_kill_during_commit_delivers_each_experience_once_after_restart(double, policy_site, tmp_path, point, pending, next_proxy,
                                                                         builders):  # fmt: skip
    """6 responses rewarded, then /commit, and the proxy's process SIGKILLs itself inside it right
    before or right after the experience buffer's write (an SQLite buffer written by Trinity's
    SQLExperienceStorage, the storage of a serve's experience buffer). A new process on the same
    proxy_history.db and buffer, and its /commit: each experience is in the buffer exactly once.
    With RFTSTACK_PROXY_COMMIT_PENDING=0 (the commit-marks patch without its mark before the write)
    a kill after the write delivers the 6 again: the window the mark closes."""
    work = tmp_path / "proxy"
    env = {"RFTSTACK_PROXY_COMMIT_PENDING": "1" if pending else "0"}
    px2 = next_proxy(double.base_url, work, policy_site, buffer=True, env=env)
    px = Proxy(double.base_url, work, policy_site, buffer=True, kill_in_commit=point, env=env)
    try:
        ids = [ask(px, i, max_tokens=3) for i in range(6)]
        for rid in ids:
            feedback(px, rid, 0.5)
        with pytest.raises(OSError):  # the connection dies with the process
            post(px.base + "/commit", {})
        assert px.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill9(px)
    assert f"KILL {point}" in px.log.read_text()
    written = ids if point == "after-write" else []
    assert sorted(buffer_ids(px.buffer)) == sorted(written)
    assert consumed(px.db) == {rid: 3 if pending else 1 for rid in ids}  # 3: the /commit was under way

    px2.release()
    try:
        restored = 0 if pending and point == "after-write" else len(ids)
        assert f"RESTORED {restored}" in px2.log.read_text()
        assert post(px2.base + "/commit", {})["status"] == "success"
    finally:
        px2.stop()
    delivered = buffer_ids(px2.buffer)
    if not pending:
        assert sorted(delivered) == sorted(ids * 2), "without the mark before the write, the cut-off /commit is delivered again"
        return
    assert sorted(delivered) == sorted(ids)  # each experience once, wherever the kill fell
    assert consumed(px2.db) == {rid: 2 for rid in ids}  # committed: no later process delivers them


def test_every_crash_test_on_the_full_patch_set_runs_with_builders_too():
    """docs/serve.md: the crash tests on the policy's whole patch set run with and without builders."""
    import inspect

    full = {n: f for n, f in globals().items() if n.startswith("test_") and "policy_site" in inspect.signature(f).parameters}
    assert len(full) == 3, sorted(full)
    assert [n for n, f in full.items() if "builders" not in inspect.signature(f).parameters] == []
