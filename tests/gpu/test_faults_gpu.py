"""Faults on a GPU, through `rftstack serve` on real vLLM and Trinity (the report's config on the
tiny model), each case with a serve of its own:

1. kill -9 of the serve's Ray head (its GCS, `gcs_server`) while 8 clients chat, post /feedback
   and /commit: serve exits 1 with `the Ray head's GCS died`, every experience committed before
   the kill is unchanged in the experience buffer, nothing is left running, GPU memory is back,
   status `failed`;
2. kill -9 of the `trinity run` process (the driver, not its Explorer actor) under the same load:
   the same, with `trinity exited with code -9`;
3. a full disk under the proxy's store (explorer.db_url on an 8 MiB tmpfs, filled): a chat is
   answered 507 `type: experience_store` with the sentence of
   patches/trinity-proxy-store-errors.patch, the rows recorded before are intact
   (integrity_check), recording works again once space is freed, /feedback and /commit deliver,
   SIGINT stops everything. Needs root (mount); skipped otherwise.

Run on the GPU host:  python3 -m pytest -v -s tests/gpu/test_faults_gpu.py
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ServeRun, fill, ray_gcs_pid, trinity_driver_pids
from gpu_helpers import (
    assert_all_stopped,
    experience_rows,
    gpu_memory_used_mib,
    has_gpu,
    post,
    start,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

CLIENTS = 8
COMMIT_EVERY_S = 2.0
LOAD_BEFORE_KILL_S = 8.0
LOAD_REWARD = 0.75
STORE_MIB = 8


class Load:
    """CLIENTS threads, each sending a chat completion and then /feedback for it, in a loop; one
    more thread posts /commit every COMMIT_EVERY_S. Errors are counted (the serve is killed under it)."""

    def __init__(self, base: str, model: str):
        self.base, self.model = base, model
        self.received: list[str] = []  # response ids the clients got (list.append is atomic)
        self.errors: list[str] = []
        self.commits = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self._committer, daemon=True))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)

    def _client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                r = post(self.base + "/v1/chat/completions",
                         {"model": self.model, "messages": [{"role": "user", "content": f"c{i} {n}"}], "max_tokens": 16}, timeout=30)  # fmt: skip
                self.received.append(r["id"])
                post(self.base + "/feedback", {"msg_ids": [r["id"]], "reward": LOAD_REWARD}, timeout=30)
            except Exception as exc:  # expected once the serve is killed
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                time.sleep(0.2)

    def _committer(self) -> None:
        while not self.stop.wait(COMMIT_EVERY_S):
            try:
                post(self.base + "/commit", {}, timeout=30)
                self.commits += 1
            except Exception as exc:
                self.errors.append(f"commit: {type(exc).__name__}: {exc}"[:200])


def integrity(db: str) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("pragma integrity_check").fetchone()[0]
    finally:
        con.close()


def wait_rows(db: str, done: Callable[[list[tuple[str, float]]], bool], limit_s: float = 60) -> list[tuple[str, float]]:
    """The experience buffer's rows once ``done(rows)`` holds (or after ``limit_s``); a buffer
    whose table Trinity has not made yet counts as empty."""

    def rows_now() -> list[tuple[str, float]]:
        try:
            return experience_rows(db)
        except sqlite3.OperationalError as exc:
            print(f"experience buffer not readable yet: {exc}")
            return []

    t0 = time.monotonic()
    rows = rows_now()
    while not done(rows) and time.monotonic() - t0 < limit_s:
        time.sleep(1)
        rows = rows_now()
    return rows


def exit_event(run: ServeRun) -> dict:
    ends = [e for e in run.events if e["event"] == "exit"]
    assert ends, f"no exit event; stderr: {run.stderr[-3000:]}"
    return ends[-1]


def cleanup(run: ServeRun) -> None:
    from rftstack.run import supervisor

    run.kill()
    for tag in run.tags():
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)


def kill_under_load(tmp: Path, name: str, victim_of: Callable[[ServeRun], tuple[int, str]], reason: str) -> None:
    """Start a serve, put CLIENTS clients on it, kill -9 the process ``victim_of(run)`` names, and
    check: exit 1 with ``reason``, nothing committed before the kill lost or changed, no row
    twice, the buffer intact, nothing left running, GPU memory back, status failed."""
    from rftstack.run import supervisor

    baseline = gpu_memory_used_mib()
    run = start(tmp, name, project="faults")
    try:
        t_start = time.monotonic()
        ready = run.wait_event("ready", timeout=900)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        print(f"[{name}] ready after {time.monotonic() - t_start:.0f} s; GPU baseline {baseline} MiB, now {gpu_memory_used_mib()} MiB")
        base, model = ready["endpoint"][: -len("/v1")], ready["model"]
        db = ready["data"]["experience_buffer"][len("sqlite:///"):]
        tags = run.tags()
        assert len(tags) == 2, f"expected the serve's tag and its Ray head's: {tags}"
        for tag in tags:
            print(f"[{name}] processes of {tag}: {[(p.pid, p.cmdline[:70]) for p in supervisor.tagged(tag)]}")
        victim, what = victim_of(run)
        with Load(base, model) as load:
            time.sleep(LOAD_BEFORE_KILL_S)
            post(base + "/commit", {}, timeout=60)  # so that something is committed whatever the timing
            before = wait_rows(db, lambda rows: len(rows) > 0)
            assert before, f"nothing committed after {LOAD_BEFORE_KILL_S} s of load ({len(load.received)} responses, errors {load.errors[:3]})"
            print(f"[{name}] {len(load.received)} responses, {load.commits} commits by the load, {len(before)} rows committed; "
                  f"errors so far {len(load.errors)}; kill -9 {what} (pid {victim})")  # fmt: skip
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            rc = run.finish(timeout=300)
            took = time.monotonic() - t0
        end = exit_event(run)
        print(f"[{name}] serve ended {took:.1f} s after the kill, exit {rc}: {end['reason']!r}; "
              f"{len(load.received)} responses in all, {len(load.errors)} client errors (first: {load.errors[:2]})")  # fmt: skip
        print(f"[{name}] last lines of serve's stderr:\n" + "\n".join(run.stderr.splitlines()[-40:]))
        assert rc == 1, run.stderr[-3000:]
        assert end["code"] == 1 and end["reason"] == reason, end
        assert f"FAILED: {reason}" in run.stderr
        assert integrity(db) == "ok"
        after = experience_rows(db)
        committed = dict(after)
        print(f"[{name}] experience buffer: {len(before)} rows before the kill, {len(after)} after")
        assert len(committed) == len(after), "a committed experience is in the buffer twice"
        assert [(m, committed.get(m)) for m, _ in before] == before  # nothing committed before the kill lost or changed
        assert set(committed) <= set(load.received) and set(committed.values()) == {LOAD_REWARD}
        assert_all_stopped(run, tags, baseline)
        st = run.status()
        assert st["phase"] == "failed" and st["exit_code"] == 1 and st["exit_reason"] == reason, st
    finally:
        cleanup(run)


def gcs_of(run: ServeRun) -> tuple[int, str]:
    ray_tag = (run.status().get("ray") or {}).get("tag")
    assert ray_tag, f"status.json names no Ray head of this serve: {run.status()}"
    pid = ray_gcs_pid(ray_tag)
    assert pid, f"no gcs_server among the processes tagged {ray_tag}"
    return pid, "the Ray head's gcs_server"


def trinity_of(run: ServeRun) -> tuple[int, str]:
    st = run.status()
    found = trinity_driver_pids(st["tag"])
    print(f"`trinity run` processes: {found}; status.json trinity_pid {st.get('trinity_pid')}")
    # the process serve started and waits for (a wrapper that does not exec would be a second one)
    assert st.get("trinity_pid") in found, f"status.json's trinity_pid {st.get('trinity_pid')} is not among {found}"
    return st["trinity_pid"], "the `trinity run` process"


def test_kill9_ray_head_under_load(tmp_path):
    kill_under_load(tmp_path, "gcs", gcs_of, "the Ray head's GCS died")


def test_kill9_trinity_under_load(tmp_path):
    kill_under_load(tmp_path, "trinity", trinity_of, "trinity exited with code -9")


@pytest.fixture
def small_fs(tmp_path):
    """An STORE_MIB tmpfs of its own (root only), unmounted at the end whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("the full-disk case mounts a tmpfs, which needs root")
    mnt = tmp_path / "store"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_MIB}m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    try:
        yield mnt
    finally:
        r = subprocess.run(["umount", "-l", str(mnt)], capture_output=True, text=True)
        print(f"umount {mnt}: rc {r.returncode} {r.stderr.strip()}")


def history(db: Path) -> list[tuple[str, float | None]]:
    """(msg_id, reward) of the proxy's store (proxy_history), in row order."""
    con = sqlite3.connect(db)
    try:
        return list(con.execute("select msg_id, reward from proxy_history order by id"))
    finally:
        con.close()


def chat(base: str, model: str, text: str) -> tuple[int, dict]:
    """A chat completion's status and body (an HTTP error's JSON body, or its text as "raw")."""
    try:
        return 200, post(base + "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}, timeout=60)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")[:500]}


def test_full_disk_under_the_store(tmp_path, small_fs):
    store = small_fs / "proxy_history.db"
    db_url = f"sqlite:///{store}"
    baseline = gpu_memory_used_mib()
    # only the proxy's store is on the small disk: model, Ray temp, logs and the experience buffer are not
    run = start(tmp_path, "full", project="faults", explorer={"db_url": db_url})
    try:
        ready = run.wait_event("ready", timeout=900)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        assert ready["data"]["proxy_history"] == db_url, ready["data"]
        base, model = ready["endpoint"][: -len("/v1")], ready["model"]
        buffer = ready["data"]["experience_buffer"][len("sqlite:///"):]
        tags = run.tags()
        first = [chat(base, model, f"before {i}") for i in range(3)]
        assert [c for c, _ in first] == [200, 200, 200], first
        ids = [b["id"] for _, b in first]
        rows_before = history(store)
        assert [m for m, _ in rows_before] == ids, (rows_before, ids)
        filler = fill(small_fs)
        print(f"store disk filled: {sorted((p.name, p.stat().st_size) for p in small_fs.iterdir())}; {os.statvfs(small_fs).f_bavail} blocks free")
        answers: list[tuple[int, dict]] = []
        for i in range(200):
            answers.append(chat(base, model, f"full {i}"))
            if answers[-1][0] != 200:
                break
        status, body = answers[-1]
        print(f"full disk: {len(answers) - 1} more response(s) fitted, then {status} {body}")
        sentence = (f"the experience store is full (database or disk is full: {db_url}), so this response was not recorded "
                    "and is not returned; free space on that disk or point explorer.db_url elsewhere, then retry")  # fmt: skip
        assert status == 507 and body == {"error": {"message": sentence, "type": "experience_store", "code": 507}}, answers[-3:]
        fitted = [b["id"] for _, b in answers[:-1]]
        rows_full = history(store)
        assert integrity(str(store)) == "ok"
        assert rows_full[: len(rows_before)] == rows_before  # nothing recorded before the disk filled is lost or changed
        assert [m for m, _ in rows_full] == ids + fitted  # every 200 recorded, the 507 not
        os.remove(filler)
        code, again = chat(base, model, "after")
        print(f"space freed: chat {code}; store {sorted((p.name, p.stat().st_size) for p in small_fs.iterdir())}")
        assert code == 200, again
        everything = ids + fitted + [again["id"]]
        assert [m for m, _ in history(store)] == everything  # recording works again
        fed = post(base + "/feedback", {"msg_ids": everything, "reward": 0.5})
        committed = post(base + "/commit", {})
        print(f"/feedback for {len(everything)}: {fed}; /commit: {committed}")
        assert fed == {"status": "success", "updated": len(everything)} and committed == {"status": "success"}
        rows = wait_rows(buffer, lambda r: len(r) >= len(everything))
        print(f"after /feedback and /commit: {len(rows)} rows in the experience buffer for {len(everything)} responses")
        assert sorted(rows) == sorted((m, 0.5) for m in everything)  # each once, with its reward
        assert integrity(str(store)) == "ok" and integrity(buffer) == "ok"
        run.proc.send_signal(signal.SIGINT)
        rc = run.finish(timeout=300)
        print(f"SIGINT: exit {rc}: {exit_event(run)['reason']!r}")
        assert rc == 0, run.stderr[-3000:]
        assert run.status()["phase"] == "stopped"
        assert_all_stopped(run, tags, baseline)
    finally:
        cleanup(run)
