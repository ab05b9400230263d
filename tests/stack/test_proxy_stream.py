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
import shutil
import time
import urllib.request

import pytest


from doubles.vllm_stream_double import VLLMStreamDouble
from proxy_helpers import Proxy, post


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


SHIELD = "with anyio.CancelScope(shield=True):"


@pytest.mark.parametrize("shielded", [True, False], ids=["patched", "patched-without-its-shields"])
def test_a_client_that_leaves_mid_stream_still_yields_its_partial_experience(patched_site, tmp_path, shielded):
    """docs/serve.md: a client that leaves mid-stream still yields its partial experience. Starlette
    cancels the proxy's response generator when the client goes; the patch's shielded cancel scopes
    let the `finally` record what was streamed so far. The second case takes the shields out of the
    patched app.py and expects the record to be lost, which shows the shields are what keep it."""
    site = patched_site
    if not shielded:
        site = tmp_path / "site"
        shutil.copytree(patched_site, site)
        app = site / "trinity/explorer/proxy/app.py"
        text = app.read_text()
        assert text.count(SHIELD) == 2
        app.write_text(text.replace(SHIELD, "if True:"))
    with VLLMStreamDouble(token_delay_s=0.2) as slow:
        px = Proxy(slow.base_url, tmp_path / "proxy", site)
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "leave early"}], "max_tokens": 40, "stream": True}
            req = urllib.request.Request(px.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as resp:
                got = [resp.readline() for _ in range(6)]  # a few events of a 40-token, 8 s stream
            assert any(line.startswith(b"data: {") for line in got) and not any(b"[DONE]" in line for line in got)
            (rid,) = slow.sent  # the one request upstream saw
            end = time.monotonic() + 20
            while rid not in px.rows() and time.monotonic() < end:
                time.sleep(0.2)
            rows = px.settled_rows(1 if shielded else 0)
            if not shielded:
                assert rows == [], "recorded without the shields: the client's leaving cancelled nothing"
                return
            assert rows == [rid]
            assert post(px.base + "/feedback", {"reward": 1.0, "msg_ids": [rid], "task_id": "t", "run_id": 0})["status"] == "success"
            assert post(px.base + "/commit", {})["status"] == "success"
            kept, sent = px.commits_by_id()[rid]["token_ids"], slow.sent[rid]["token_ids"]
            assert 0 < len(kept) < len(sent) and kept == sent[: len(kept)]  # the part streamed before the client left
            assert "Failed to record" not in px.log.read_text()
        finally:
            px.stop()
