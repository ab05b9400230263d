"""A streamed chat completion through Trinity 0.6.0's real proxy app must become exactly one
experience (tokens and logprobs as vLLM streamed them) that /feedback and /commit deliver.

Upstream is tests/doubles/vllm_stream_double.py, a TEST DOUBLE of vLLM 0.23.0's streaming chat
endpoint (vLLM needs a GPU) built from vLLM's own protocol classes; the proxy, its recorder
(SQLite) and ExplorerService's methods are Trinity's real code (tests/doubles/trinity_proxy_host.py),
driven by the `openai` client with stream=True as the GPU test does. Unpatched Trinity loses the
streamed experience: the client closes the connection after [DONE], Starlette cancels the response
generator, and the SQLite write in its `finally` dies of CancelledError (not an Exception, so not
even Trinity's `except Exception: pass` sees it). patches/trinity-proxy-stream-record.patch fixes it.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rftstack import patches, policy

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "doubles"))
from vllm_stream_double import VLLMStreamDouble  # noqa: E402

from test_patches import add_trinity_proxy  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


class Proxy:
    """Trinity's proxy app in a child process (its own session; killed on exit)."""

    def __init__(self, upstream: str, work: Path, site: Path | None):
        work.mkdir(parents=True, exist_ok=True)
        self.db, self.commits, self.log = work / "proxy_history.db", work / "commits.jsonl", work / "proxy.log"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(HERE / "doubles" / "trinity_proxy_host.py"), "--upstream", upstream, "--port", str(self.port),
               "--db", str(self.db), "--commits", str(self.commits), "--trace"] + (["--trinity-site", str(site)] if site else [])
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 240
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the proxy exited: {self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError("the proxy did not answer /health")
                time.sleep(0.3)
        from openai import OpenAI

        self.client = OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=60)

    def stream(self, content: str, max_tokens: int = 6, **kw) -> tuple[str, list]:
        chunks = list(self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens, stream=True, **kw))
        ids = {c.id for c in chunks}
        assert len(ids) == 1 and len(chunks) > 1
        return ids.pop(), chunks

    def rows(self) -> list[str]:
        if not self.db.exists():
            return []
        con = sqlite3.connect(self.db)
        try:
            return [m for (m,) in con.execute("select msg_id from proxy_history order by id")]
        finally:
            con.close()

    def settled_rows(self, expect: int) -> list[str]:
        """The rows once no write is in flight (the proxy's log has as many RECORD ends as starts)."""
        for _ in range(100):
            log = self.log.read_text()
            if log.count("RECORD start") == log.count("RECORD done") + log.count("RECORD raised") and len(self.rows()) >= expect:
                break
            time.sleep(0.1)
        return self.rows()

    def commits_by_id(self) -> dict:
        if not self.commits.exists():
            return {}
        return {d["msg_id"]: d for d in map(json.loads, self.commits.read_text().splitlines())}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def double():
    with VLLMStreamDouble() as d:
        yield d


def _trinity_copy(tmp_path_factory, name: str) -> Path:
    """A copy of the installed trinity package whose proxy app.py is Trinity's original (whatever the
    environment's `rftstack relax` did to the installed one)."""
    import trinity

    site = tmp_path_factory.mktemp(name)
    shutil.copytree(Path(trinity.__file__).parent, site / "trinity", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "trinity/explorer/proxy/app.py").unlink()
    add_trinity_proxy(site)  # the original app.py and trinity-rft's dist-info
    return site


@pytest.fixture(scope="module")
def original_site(tmp_path_factory) -> Path:
    return _trinity_copy(tmp_path_factory, "original")


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory) -> Path:
    """The same copy with the policy's stream-record patch applied by patches.apply, after the
    store-errors patch it builds on (the policy's order)."""
    site = _trinity_copy(tmp_path_factory, "site")
    for name in ("trinity-proxy-store-errors.patch", "trinity-proxy-stream-record.patch"):
        (p,) = [p for p in policy.load().patches if p.file == name]
        assert patches.apply(site, patches.patches_dir() / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version) == [
            ("trinity/explorer/proxy/app.py", "applied")]
    return site


@pytest.fixture(scope="module")
def unpatched(double, original_site, tmp_path_factory):
    px = Proxy(double.base_url, tmp_path_factory.mktemp("unpatched"), original_site)
    yield px
    px.stop()


@pytest.fixture(scope="module")
def patched(double, patched_site, tmp_path_factory):
    px = Proxy(double.base_url, tmp_path_factory.mktemp("patched"), patched_site)
    yield px
    px.stop()


def test_double_speaks_like_vllm(double):
    """The first chunk alone has prompt_token_ids (role-only delta); every token chunk has one token
    id and one logprob; the last has finish_reason; the usage chunk has no choices; then [DONE]."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "return_token_ids": True, "logprobs": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", double.base_url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] and chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["logprobs"] is None and "token_ids" not in chunks[0]["choices"][0]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    toks = chunks[1:-1]
    assert len(toks) == 3 and all(len(c["choices"][0]["token_ids"]) == 1 and len(c["choices"][0]["logprobs"]["content"]) == 1 for c in toks)
    assert [c["choices"][0]["finish_reason"] for c in toks] == [None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_unpatched_trinity_loses_streamed_experiences(unpatched, double):
    plain = unpatched.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plain"}], max_tokens=4).id
    streamed = [unpatched.stream(f"stream {k}")[0] for k in range(4)]
    rows = unpatched.settled_rows(1)
    assert plain in rows  # the non-streamed response is recorded
    lost = [s for s in streamed if s not in rows]
    assert lost, "every streamed experience was recorded: the bug did not reproduce"
    log = unpatched.log.read_text()
    # the evidence: the write started and was cancelled, which `except Exception: pass` does not even see
    assert any(f"RECORD raised {s} asyncio.exceptions.CancelledError" in log for s in lost), log[-3000:]


@pytest.mark.parametrize("split_bytes,usage", [(0, False), (0, True), (7, True), (1, False)])
def test_patched_records_each_stream_once_and_feedback_commit_deliver_it(patched, double, split_bytes, usage):
    double.split_bytes = split_bytes  # upstream events cut into pieces: aiter_raw sees arbitrary splits
    try:
        rid, chunks = patched.stream(f"split {split_bytes} usage {usage}", max_tokens=5,
                                     stream_options={"include_usage": True} if usage else None)
        # no waiting: an agent posts /feedback as soon as it has read [DONE]
        assert post(patched.base + "/feedback", {"reward": 0.5, "msg_ids": [rid], "task_id": "t", "run_id": 0})["status"] == "success"
        assert post(patched.base + "/commit", {})["status"] == "success"
    finally:
        double.split_bytes = 0
    assert patched.rows().count(rid) == 1
    sent = double.sent[rid]
    got = patched.commits_by_id()[rid]
    assert got["prompt_token_ids"] == sent["prompt_token_ids"] and got["token_ids"] == sent["token_ids"]
    assert got["logprobs"] == pytest.approx(sent["logprobs"]) and got["reward"] == 0.5
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"t{t} " for t in sent["token_ids"])  # the client got the whole stream too
    assert "Failed to record" not in patched.log.read_text()


def test_patched_sixteen_concurrent_streams_sixteen_rows(patched, double):
    before = set(patched.rows())
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(lambda i: patched.stream(f"concurrent {i}", max_tokens=8)[0], range(16)))
    assert len(set(ids)) == 16
    assert post(patched.base + "/feedback", {"reward": 1.0, "msg_ids": ids, "task_id": "c", "run_id": 0})["status"] == "success"
    assert post(patched.base + "/commit", {})["status"] == "success"
    new = [r for r in patched.rows() if r not in before]
    assert sorted(new) == sorted(ids)  # 16 rows, one per stream
    commits = patched.commits_by_id()
    for rid in ids:
        assert commits[rid]["token_ids"] == double.sent[rid]["token_ids"] and commits[rid]["reward"] == 1.0
