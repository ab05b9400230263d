"""patches/trinity-proxy-build-processes.patch: the experiences of an answer built and serialized in
builder processes beside the proxy's (RFTSTACK_PROXY_BUILD_PROCESSES).

Trinity's REAL proxy app, ExplorerService.record_experience and HistoryRecorder (SQLite) in a child
process (tests/doubles/trinity_proxy_host.py), the installed trinity with the policy's patches, and
real builder processes (python -m trinity.explorer.proxy.recorder); upstream is the vLLM 0.23.0 TEST
DOUBLE (tests/doubles/vllm_stream_double.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from proxy_helpers import Proxy, assert_intact, stored

VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"
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
    assert recorder.build_processes({}, cpus=16) == 0  # the default: upstream's building in the proxy's loop
    assert [recorder.build_processes({VAR: "auto"}, cpus=n) for n in (1, 2, 3, 4, 8, 15, 16, 64)] == [0, 0, 0, 1, 2, 3, 4, 4]
    assert recorder.build_processes({VAR: "0"}, cpus=16) == 0
    assert recorder.build_processes({VAR: " 3 "}, cpus=2) == 3
    for bad in ("yes", "-1", "1.5", "33", ""):
        with pytest.raises(ValueError, match=f"{VAR} must be 0 .* not {re.escape(repr(bad.strip()))}"):
            recorder.build_processes({VAR: bad})


ANSWER = {"id": "chatcmpl-unit", "prompt_token_ids": [5, 6, 7],
          "choices": [{"token_ids": [8, 9], "rftstack_logprobs": [-0.5, -0.25]},
                      {"token_ids": [10], "logprobs": {"content": [{"logprob": -1.5}]}},
                      {"token_ids": [11], "logprobs": None}]}  # fmt: skip


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
            await builder.connect()
            end = time.monotonic() + 180
            while not builder.ready:
                assert time.monotonic() < end and builder.process.poll() is None, "the builder did not start"
                await asyncio.sleep(0.1)
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


def test_a_bad_value_stops_the_proxy_with_one_sentence(double, tmp_path):
    with pytest.raises(RuntimeError, match="the proxy exited") as e:
        Proxy(double.base_url, tmp_path / "proxy", None, env={VAR: "many"})
    assert f"{VAR} must be 0 (the experiences built in the proxy's loop, as upstream Trinity, the default), auto" in str(e.value)


def test_answers_wait_for_their_builder_and_are_committed_before_they_return(double, tmp_path):
    """With the builders stopped (SIGSTOP) an answer is neither returned nor recorded; once they go on,
    it is both. Plain and streamed answers, each row whole (prompt, completion, logprobs as sent)."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={VAR: "2"})
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


def test_a_builder_that_dies_fails_its_answer_and_the_next_ones_are_recorded(double, tmp_path):
    """SIGKILL of the builder holding an answer: that answer is not returned and not recorded (an error);
    later answers are recorded by the builder left, then by the proxy itself once none is left."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={VAR: "2"})
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
        assert re.fullmatch(r"the proxy's experience builder process \d+ ended before it built this response's experience, "
                            r"so this response was not recorded and is not returned; retry it", e.value.body["message"]), e.value.body
        later = [chat(px, f"after {i}") for i in range(3)]  # no builder left: built in the proxy's loop
        assert px.rows() == [first, *later]
    finally:
        px.stop()


@pytest.mark.parametrize("end", ["kill9-proxy-alone", "ctrl-c-to-the-group"])
def test_the_builders_end_with_the_proxy_however_it_ends(double, tmp_path, end):
    """SIGKILL of the proxy's process alone (not its group): its builders see their socket close and end.
    SIGINT to the whole group (a Ctrl-C): the builders ignore it and end once the proxy has ended."""
    px = Proxy(double.base_url, tmp_path / "proxy", None, env={VAR: "2"})
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


DURABILITY = [
    "tests/stack/test_crash_durability.py::test_kill9_mid_burst_keeps_every_response_the_client_received",
    "tests/stack/test_store_full.py",
]


def test_the_durability_and_store_full_tests_pass_unchanged_with_builders():
    """Those tests as they are, in a pytest of their own whose proxies run two builder processes."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DURABILITY], cwd=ROOT,
                       env={**os.environ, VAR: "2"}, capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert re.search(r"\d+ passed", r.stdout) and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
