"""patches/trinity-proxy-build-processes.patch: the experiences of an answer built and serialized in
builder processes beside the proxy's (RFTSTACK_PROXY_BUILD_PROCESSES), or built, serialized and committed
by recording processes (RFTSTACK_PROXY_RECORD_PROCESSES).

Trinity's REAL proxy app, ExplorerService.record_experience and HistoryRecorder (SQLite) in a child
process (tests/doubles/trinity_proxy_host.py), the installed trinity with the policy's patches, and
real builder and recording processes (recorder.py run as a script); upstream is the vLLM 0.23.0 TEST
DOUBLE (tests/doubles/vllm_stream_double.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from helpers import fill
from proxy_helpers import Proxy, assert_intact, stored

VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"
RECORD_VAR = "RFTSTACK_PROXY_RECORD_PROCESSES"
MODES = {"builders": VAR, "recorders": RECORD_VAR}  # the processes' kind: the variable that starts them
DOING = {"builders": ("builder", "built"), "recorders": ("recorder", "recorded")}  # in the 503's sentence
ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def chat(px: Proxy, content: str, max_tokens: int = 5) -> str:
    r = px.client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens)
    return r.id


def test_switch_values():
    from trinity.explorer.proxy import recorder

    assert recorder.BUILD_PROCESSES_VAR == VAR, "the installed Trinity lacks the build-processes patch: run `rftstack relax`"
    cpus = (1, 2, 3, 4, 8, 15, 16, 64)
    assert [recorder.build_processes({VAR: "auto"}, cpus=n) for n in cpus] == [0, 0, 0, 1, 2, 3, 4, 4]
    # the default (since session AH): auto; none below 4 CPUs, so the proxy builds as upstream there
    assert [recorder.build_processes({}, cpus=n) for n in cpus] == [0, 0, 0, 1, 2, 3, 4, 4]
    # unset while recording processes are asked for: none (they build), and no refusal
    assert recorder.build_processes({RECORD_VAR: "2"}, cpus=16) == 0
    assert recorder.build_processes({RECORD_VAR: "0"}, cpus=16) == 4
    assert recorder.record_processes({RECORD_VAR: "2"}, cpus=16) == 2
    assert recorder.record_processes({RECORD_VAR: "auto"}, cpus=16) == 4
    assert recorder.build_processes({VAR: "0"}, cpus=16) == 0
    assert recorder.build_processes({VAR: " 3 "}, cpus=2) == 3
    for bad in ("yes", "-1", "1.5", "33", ""):
        with pytest.raises(ValueError, match=f"{VAR} must be 0 .* not {re.escape(repr(bad.strip()))}"):
            recorder.build_processes({VAR: bad})
        with pytest.raises(ValueError, match=f"{RECORD_VAR} must be 0 .* not {re.escape(repr(bad.strip()))}"):
            recorder.record_processes({RECORD_VAR: bad})
    assert recorder.record_processes({}, cpus=16) == 0
    assert recorder.record_processes({RECORD_VAR: "auto"}, cpus=8) == 2
    assert recorder.record_processes({RECORD_VAR: "4", VAR: "0"}, cpus=2) == 4
    with pytest.raises(ValueError, match=f"{VAR} and {RECORD_VAR} are both set; .*: set one of them"):
        recorder.record_processes({RECORD_VAR: "2", VAR: "auto"}, cpus=16)


def test_the_log_names_the_setting():
    """What the proxy's log line `Experience builders: N processes (...)` says of the variable (docs/serve.md):
    its value as set, or `unset:` and the default the counts above were taken from."""
    from trinity.explorer.proxy import recorder

    assert recorder.setting(VAR, {}) == f"{VAR} unset: auto"
    assert recorder.setting(VAR, {VAR: " 3 "}) == f"{VAR}=3"
    assert recorder.setting(RECORD_VAR, {}) == f"{RECORD_VAR} unset: 0"
    assert recorder.setting(RECORD_VAR, {RECORD_VAR: "auto"}) == f"{RECORD_VAR}=auto"
    # the defaults the log names are the ones the counts use
    assert recorder.build_processes({}, cpus=16) == recorder.build_processes({VAR: recorder.DEFAULTS[VAR]}, cpus=16)
    assert recorder.record_processes({}, cpus=16) == recorder.record_processes({RECORD_VAR: recorder.DEFAULTS[RECORD_VAR]}, cpus=16)


ANSWER = {"id": "chatcmpl-unit", "prompt_token_ids": [5, 6, 7],
          "choices": [{"token_ids": [8, 9], "rftstack_logprobs": [-0.5, -0.25]},
                      {"token_ids": [10], "logprobs": {"content": [{"logprob": -1.5}]}},
                      {"token_ids": [11], "logprobs": None}]}  # fmt: skip


async def started(process) -> None:
    """Connect to a builder or recording process and wait until it says it is ready."""
    import asyncio

    await process.connect()
    end = time.monotonic() + 180
    while not process.ready:
        assert time.monotonic() < end and process.process.poll() is None, f"the {process.what} did not start"
        await asyncio.sleep(0.1)


def test_a_builder_gives_what_the_proxy_would_build_and_raises_what_it_would_raise():
    """One real builder process, driven as the proxy drives it: the rows' fields and bytes of an answer
    with numeric, JSON and no logprobs are those of ExplorerService.record_experience's own building; an
    answer it cannot build raises the exception the proxy's loop would raise, from the builder."""
    import asyncio

    from trinity.common.experience import Experience
    from trinity.explorer.proxy import recorder

    async def go() -> None:
        builder = recorder._Builder()
        try:
            await started(builder)
            built = await builder.build(ANSWER, 7)
            own = recorder.experiences_of(ANSWER, 7)
            assert len(built) == len(own) == 3
            for b, e in zip(built, own):
                assert (b.reward, b.eid.task, b.eid.run, b.eid.suffix, b.info) == (e.reward, e.eid.task, e.eid.run, "chatcmpl-unit", {"model_version": 7})
                got = Experience.deserialize(b.serialize())
                assert got.tokens.tolist() == e.tokens.tolist() and got.logprobs.tolist() == e.logprobs.tolist()
                assert got.prompt_length == e.prompt_length == 3
            assert [Experience.deserialize(b.serialize()).logprobs.tolist() for b in built] == [[-0.5, -0.25], [-1.5], []]
            with pytest.raises(KeyError, match="prompt_token_ids"):  # the proxy's loop raised this one before
                await builder.build({"id": "x", "choices": [{"token_ids": [1]}]}, 0)
            bad = {"id": "x", "prompt_token_ids": [1], "choices": [{"token_ids": ["one"], "rftstack_logprobs": [0.0]}]}
            with pytest.raises(Exception) as in_loop:
                recorder.experiences_of(bad, 0)
            with pytest.raises(type(in_loop.value), match=re.escape(str(in_loop.value))):  # raised in the builder
                await builder.build(bad, 0)
            assert builder.ready and builder.gone is None  # it goes on after a bad answer
        finally:
            builder.socket.close()
            builder.process.wait(timeout=30)

    asyncio.run(go())


def test_a_recording_process_commits_what_the_proxy_would_and_raises_what_it_would_raise(tmp_path):
    """One real recording process on an SQLite file, driven as the proxy drives it: the rows it commits
    hold the experiences the service's own building gives; an answer it cannot build raises the loop's
    exception; a write its store refuses raises the sqlite3.OperationalError with SQLite's words (what the
    store-errors patch answers with its sentence), nothing committed for either."""
    import asyncio
    import sqlite3

    from trinity.explorer.proxy import recorder

    db = tmp_path / "history.db"

    async def go() -> None:
        process = recorder._RecordingProcess({"RFTSTACK_PROXY_RECORD_DB_URL": f"sqlite:///{db}",
                                              "RFTSTACK_PROXY_RECORD_TABLE": "proxy_history"})
        try:
            await started(process)
            assert await process.build(ANSWER, 7) == 3
            check, rows = stored(db)
            assert check == "ok" and list(rows) == ["chatcmpl-unit"]
            own = recorder.experiences_of(ANSWER, 7)
            assert [(r["exp"].tokens.tolist(), r["exp"].logprobs.tolist(), r["exp"].prompt_length, r["exp"].info) for r in rows["chatcmpl-unit"]] == [
                (e.tokens.tolist(), e.logprobs.tolist(), e.prompt_length, e.info) for e in own]
            with pytest.raises(KeyError, match="prompt_token_ids"):
                await process.build({"id": "x", "choices": [{"token_ids": [1]}]}, 0)
            con = sqlite3.connect(db)
            con.execute("drop table proxy_history_blob")  # the store now refuses every write
            con.commit()
            con.close()
            with pytest.raises(sqlite3.OperationalError, match="^no such table: proxy_history_blob$"):
                await process.build(dict(ANSWER, id="refused"), 1)
            assert [m for (m,) in sqlite3.connect(db).execute("select msg_id from proxy_history")] == ["chatcmpl-unit"] * 3
            assert process.ready and process.gone is None
        finally:
            process.socket.close()
            process.process.wait(timeout=30)

    asyncio.run(go())


def test_its_building_is_the_services_own():
    """experiences_of, which the builders run, against ExplorerService.record_experience with the builders
    off: the same experiences (the copy in recorder.py must follow the service's code)."""
    import asyncio
    from types import SimpleNamespace

    from trinity.explorer.proxy import recorder
    from trinity.explorer.proxy.service import ExplorerService

    recorded: list = []
    service = SimpleNamespace(total_experience_count=0, recorder=SimpleNamespace(record_history=lambda exps: recorded.extend(exps) or asyncio.sleep(0)))
    asyncio.run(ExplorerService.record_experience(service, ANSWER, 3))  # type: ignore[arg-type]  # no HistoryRecorder: built in place
    mine = recorder.experiences_of(ANSWER, 3)
    assert [(e.tokens.tolist(), e.logprobs.tolist(), e.prompt_length, e.eid.suffix, e.info) for e in recorded] == [
        (e.tokens.tolist(), e.logprobs.tolist(), e.prompt_length, e.eid.suffix, e.info) for e in mine]


@pytest.mark.parametrize("env, sentence", [
    ({VAR: "many"}, f"{VAR} must be 0 (the experiences built in the proxy's loop, as upstream Trinity), auto (one builder "
                    f"process for every 4 CPUs, at most 4) or a number of builder processes up to 32 (unset: auto), not 'many'"),
    ({RECORD_VAR: "2", VAR: "2"}, f"{VAR} and {RECORD_VAR} are both set; recording processes build the experiences too: set one of them"),
], ids=["bad-value", "both-set"])
def test_a_bad_value_stops_the_proxy_with_one_sentence(double, tmp_path, env, sentence):
    with pytest.raises(RuntimeError, match="the proxy exited") as e:
        Proxy(double.base_url, tmp_path / "proxy", None, env=env)
    assert sentence in str(e.value)


@pytest.mark.parametrize("kind", MODES)
def test_answers_wait_for_their_builder_and_are_committed_before_they_return(double, tmp_path, kind):
    """With the builders (or recorders) stopped (SIGSTOP) an answer is neither returned nor recorded; once
    they go on, it is both. Plain and streamed answers, each row whole (prompt, completion, logprobs as sent)."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={MODES[kind]: "2"})
    try:
        pids = px.builders  # started with the proxy; Proxy waited until they were ready
        first = chat(px, "through a builder")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = [pool.submit(chat, px, f"held {i}", 4 + i) for i in range(2)]
            held += [pool.submit(lambda i=i: px.stream(f"held stream {i}", max_tokens=4 + i)[0]) for i in range(2)]
            time.sleep(2)
            assert not any(f.done() for f in held), "an answer returned while every builder was stopped"
            assert px.rows() == [first]
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            ids = [f.result(timeout=60) for f in held]
        check, rows = stored(px.db)
        assert check == "ok" and sorted(rows) == sorted([first, *ids])
        # the service's count, as /metrics reports it: each answer counted once, those released together too
        # (a count read before the process's answer and written after it lost three of these four on the GPU host)
        metrics = json.loads(urllib.request.urlopen(px.base + "/metrics", timeout=10).read())
        assert metrics["rollout/total_experience_count"] == len(rows) == 5, metrics
        for rid in [first, *ids]:
            assert len(rows[rid]) == 1
            assert_intact(rows[rid][0], double.sent[rid])
        assert all(alive(pid) for pid in pids)
    finally:
        for pid in getattr(px, "builders", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        px.stop()


@pytest.mark.parametrize("kind", MODES)
def test_a_builder_that_dies_fails_its_answer_and_the_next_ones_are_recorded(double, tmp_path, kind):
    """SIGKILL of the builder (or recorder) holding an answer: that answer is not returned and not recorded
    (an error); later answers are recorded by the proxy itself once none is left."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={MODES[kind]: "2"})
    try:
        pids = px.builders
        first = chat(px, "through a builder")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(chat, px, "held by a builder that dies")
            time.sleep(2)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(openai.APIStatusError) as e:
                held.result(timeout=60)
        assert e.value.status_code == 503, repr(e.value)
        what, done = DOING[kind]
        assert re.fullmatch(rf"the proxy's experience {what} process \d+ ended before it {done} this response's experience, "
                            r"so this response was not recorded and is not returned; retry it", e.value.body["message"]), e.value.body
        end_s = time.monotonic() + 30
        # an ended process the proxy has not heard of yet may be picked: wait until each has ended and the proxy
        # has said so (its warning, once it reads the end of that process's socket), not for the first alone
        while any(alive(pid) for pid in pids) or not all(
                f"the proxy's experience {what} process {pid} ended; with none left" in px.log.read_text() for pid in pids):
            assert time.monotonic() < end_s, f"a killed process did not end, or the proxy did not say so: {px.log.read_text()[-2000:]}"
            time.sleep(0.05)
        later = [chat(px, f"after {i}") for i in range(3)]  # no builder left: built in the proxy's loop
        assert px.rows() == [first, *later]
    finally:
        px.stop()


@pytest.mark.parametrize("kind", MODES)
@pytest.mark.parametrize("end", ["kill9-proxy-alone", "ctrl-c-to-the-group"])
def test_the_builders_end_with_the_proxy_however_it_ends(double, tmp_path, end, kind):
    """SIGKILL of the proxy's process alone (not its group): its builders see their socket close and end.
    SIGINT to the whole group (a Ctrl-C): the builders ignore it and end once the proxy has ended. The
    same for recorders."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={MODES[kind]: "2"})
    try:
        pids = px.builders
        chat(px, "through a builder")
        if end == "kill9-proxy-alone":
            os.kill(px.proc.pid, signal.SIGKILL)
        else:
            os.killpg(px.proc.pid, signal.SIGINT)
        assert px.proc.wait(timeout=30) is not None
        end_s = time.monotonic() + 30
        while any(alive(pid) for pid in pids):
            assert time.monotonic() < end_s, "a builder outlived the proxy"
            time.sleep(0.1)
        assert "Traceback" not in px.log.read_text().split("Shutting down")[-1], px.log.read_text()[-3000:]
    finally:
        px.stop()


@pytest.mark.parametrize("kind", MODES)
def test_a_full_store_is_answered_with_the_stores_sentence_once_the_processes_are_ready(double, tmp_path, full_fs, kind):
    """The proxy's table on a full disk (a 256 KiB tmpfs) while the builders or recorders are ready, so every
    answer goes through them: the answer that cannot be written gets the store-errors patch's 507 and its
    sentence, nothing of it is recorded, and once space is freed the next one is. With recorders the write
    that fails is the recording process's, and its SQLite words reach the sentence."""
    import sqlite3

    work = tmp_path / "proxy"
    work.mkdir()
    db = work / "proxy_history.db"
    db.symlink_to(full_fs / "proxy_history.db")  # the table on the small disk, the proxy's log beside it not
    px = Proxy(double.base_url, work, None, env={MODES[kind]: "2"})
    try:
        assert len(px.builders) == 2
        before = [chat(px, f"before {i}") for i in range(3)]
        filler = fill(full_fs)
        refused = None
        for i in range(40):  # what SQLite keeps free inside its file first, then the disk is full
            try:
                before.append(chat(px, f"on the full disk {i}", max_tokens=60))
            except openai.APIStatusError as exc:
                refused = exc
                break
        assert refused is not None, "every answer was recorded on a full disk"
        assert refused.status_code == 507, repr(refused)
        assert refused.body["message"] == (
            f"the experience store is full (database or disk is full: sqlite:///{db}), so this response was not "
            "recorded and is not returned; free space on that disk or point explorer.db_url elsewhere, then retry")
        rows = [m for (m,) in sqlite3.connect(db).execute("select msg_id from proxy_history order by id")]
        assert rows == before
        os.remove(filler)
        after = chat(px, "after the disk was freed")
        assert px.rows() == [*before, after]
        assert all(alive(pid) for pid in px.builders)
    finally:
        px.stop()


# test_store_full.py drives the app in this process (no lifespan): its answers come before any process is ready,
# so they are the proxy's own; the full store through the processes is the test above
DURABILITY = ["tests/stack/test_crash_durability.py::test_kill9_mid_burst_keeps_every_response_the_client_received"]


@pytest.mark.parametrize("kind", MODES)
def test_the_durability_test_passes_unchanged_with_builders(kind):
    """That test as it is, in a pytest of its own whose proxies run two builder (or recording) processes, every
    answer of it through them (the test's Proxy waits until they are ready)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DURABILITY], cwd=ROOT,
                       env={**os.environ, MODES[kind]: "2"}, capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert re.search(r"\d+ passed", r.stdout) and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
