"""patches/vllm-logprobs-undecoded.patch and patches/trinity-proxy-lean-logprobs.patch: when a client
does not ask for logprobs, Trinity's proxy asks the engine for undecoded ones (return_tokens_as_token_ids
and vllm_xargs.rftstack_logprobs_undecoded), and vLLM's output processor then does not detokenize them;
the experience (token ids, logprob numbers) is the same. RFTSTACK_PROXY_LEAN_LOGPROBS=0 (the proxy) and
RFTSTACK_VLLM_UNDECODED_LOGPROBS=0 (vLLM's API server) restore upstream.

Real: the installed vLLM's ChatCompletionRequest, SamplingParams, LogprobsProcessor and
OpenAIServingChat._create_chat_logprobs, with the tokenizer of rftstack's bench model; Trinity's
installed proxy app with its SQLite recorder in a child process (tests/doubles/trinity_proxy_host.py).
TEST DOUBLE: the engine's sampled token ids and logprobs (no GPU here). The proxy's upstream is a small
server that turns each body it gets into vLLM's answer with that real vLLM code (the request parsed by
ChatCompletionRequest, logprobs through LogprobsProcessor and _create_chat_logprobs), so the logprobs a
client and the experience get are the ones vLLM's own code builds for the proxy's request.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from patch_helpers import VLLM_REL
from proxy_helpers import Proxy
from rftstack.stack import patches
from rftstack.stack import policy

KEY = "rftstack_logprobs_undecoded"
PROXY_VAR = "RFTSTACK_PROXY_LEAN_LOGPROBS"
VLLM_VAR = "RFTSTACK_VLLM_UNDECODED_LOGPROBS"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from rftstack.run import tinymodel
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tinymodel.write(tmp_path_factory.mktemp("tok") / "tiny")))


def engine_output(vocab: int, n: int, seed: int) -> tuple[list[int], list[float]]:
    """TEST DOUBLE of the engine's output for one request: sampled token ids and their logprobs."""
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)], [round(-rnd.random() * 3, 4) for _ in range(n)]


def vllm_answer(body: dict, tokenizer, seed: int) -> dict:
    """vLLM's chat answer for ``body`` (the installed vLLM's code from the parsed request to the logprobs
    content), the engine's tokens a TEST DOUBLE."""
    import numpy as np
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsLists

    req = ChatCompletionRequest(**body)
    n = body.get("max_completion_tokens") or body.get("max_tokens") or 8
    params = req.to_sampling_params(n, {})
    core = EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
                             pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None)  # fmt: skip
    ids, lps = engine_output(len(tokenizer), n, seed)
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": tokenizer.decode(ids)}, "finish_reason": "length"}
    if params.logprobs is not None:
        proc = LogprobsProcessor.from_new_request(tokenizer, core)
        for tok, lp in zip(ids, lps):
            proc._update_sample_logprobs(LogprobsLists(np.array([[tok]]), np.array([[lp]], dtype=np.float32), np.array([1]), None))
        chat = object.__new__(OpenAIServingChat)  # what _create_chat_logprobs reads; its construction needs an engine
        chat.return_tokens_as_token_ids = False
        choice["logprobs"] = chat._create_chat_logprobs(token_ids=ids, top_logprobs=proc.logprobs, tokenizer=tokenizer,
                                                        num_output_top_logprobs=req.top_logprobs,
                                                        return_as_token_id=req.return_tokens_as_token_ids).model_dump()  # fmt: skip
    if req.return_token_ids:
        choice["token_ids"] = ids
    out = {"id": f"chatcmpl-{seed}", "object": "chat.completion", "model": "m", "choices": [choice]}
    if req.return_token_ids:
        out["prompt_token_ids"] = [1, 2, 3]
    return out


# ---- vLLM's side --------------------------------------------------------------------------------


def test_vllm_is_patched_and_the_switch_values():
    from vllm.v1.engine import logprobs

    assert getattr(logprobs, "UNDECODED_KEY", None) == KEY, "the installed vLLM lacks the patch: run `rftstack relax`"
    assert logprobs.undecoded_enabled({}) is True
    assert logprobs.undecoded_enabled({VLLM_VAR: "0"}) is False
    with pytest.raises(ValueError, match=VLLM_VAR):
        logprobs.undecoded_enabled({VLLM_VAR: "no"})


def test_the_published_file_detokenizes_every_request():
    """The patch is what skips the decode: the file as published has no such branch."""
    import importlib.util

    site = Path(importlib.util.find_spec("vllm").origin).parents[1]
    text = (site / VLLM_REL).read_text()
    (p,) = [p for p in policy.load().patches if p.dist == "vllm"]
    (fp,) = patches.parse((patches.patches_dir() / p.file).read_text())
    published = patches.apply_text(text, patches.FilePatch(fp.path, [patches.Hunk(h.old_start, h.after, h.before) for h in fp.hunks]))[0]
    assert KEY not in published and "tokenizer = None" not in published
    assert patches.apply_text(published, fp)[0] == text


def _body(**kw) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "logprobs": True,
            "return_token_ids": True, **kw}


def test_undecoded_request_same_numbers_no_decode(tokenizer, monkeypatch):
    decoded = vllm_answer(_body(), tokenizer, 7)
    undecoded = vllm_answer(_body(return_tokens_as_token_ids=True, vllm_xargs={KEY: 1}), tokenizer, 7)
    ids = decoded["choices"][0]["token_ids"]
    assert undecoded["choices"][0]["token_ids"] == ids
    d, u = decoded["choices"][0]["logprobs"]["content"], undecoded["choices"][0]["logprobs"]["content"]
    assert [x["logprob"] for x in u] == [x["logprob"] for x in d] and len(u) == 24
    assert [x["token"] for x in u] == [f"token_id:{i}" for i in ids]
    assert all(x["bytes"] is None and x["top_logprobs"] == [] for x in u)
    assert all(isinstance(x["bytes"], list) for x in d) and "token_id:" not in "".join(x["token"] for x in d)
    assert undecoded["choices"][0]["message"] == decoded["choices"][0]["message"]  # the text is detokenized as before
    # token ids as tokens without the key: vLLM as upstream (decoded, so the bytes are the token's)
    as_ids = vllm_answer(_body(return_tokens_as_token_ids=True), tokenizer, 7)["choices"][0]["logprobs"]["content"]
    assert [x["bytes"] for x in as_ids] == [x["bytes"] for x in d]
    # the key without token ids as tokens: decoded on demand, the same tokens as upstream
    key_only = vllm_answer(_body(vllm_xargs={KEY: 1}), tokenizer, 7)["choices"][0]["logprobs"]["content"]
    assert [x["token"] for x in key_only] == [tokenizer.decode(i) for i in ids]
    # the switch at 0: the key is ignored
    from vllm.v1.engine import logprobs

    monkeypatch.setattr(logprobs, "_UNDECODED", False)
    off = vllm_answer(_body(return_tokens_as_token_ids=True, vllm_xargs={KEY: 1}), tokenizer, 7)["choices"][0]["logprobs"]["content"]
    assert [x["bytes"] for x in off] == [x["bytes"] for x in d]


def test_vllm_switch_is_read_at_import_and_a_bad_value_stops_it():
    code = "from vllm.v1.engine import logprobs as l; print(l._UNDECODED)"
    for value, expect in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={"PATH": "/usr/bin:/bin", VLLM_VAR: value})  # fmt: skip
        assert out.returncode == 0 and out.stdout.split()[-1] == expect, out.stderr[-2000:]  # vLLM logs to stdout too
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", VLLM_VAR: "yes"})  # fmt: skip
    assert bad.returncode != 0 and f"{VLLM_VAR} must be 1" in bad.stderr


# ---- the proxy's side ---------------------------------------------------------------------------


def test_proxy_marks_only_requests_without_logprobs():
    from trinity.explorer.proxy import app

    assert getattr(app, "LEAN_LOGPROBS_VAR", None) == PROXY_VAR, "the installed Trinity lacks the patch: run `rftstack relax`"
    assert app.UNDECODED_KEY == KEY
    assert app.lean_logprobs_enabled({}) is True and app.lean_logprobs_enabled({PROXY_VAR: "0"}) is False
    with pytest.raises(ValueError, match=PROXY_VAR):
        app.lean_logprobs_enabled({PROXY_VAR: "true"})
    ask = app._ask_lean_logprobs
    body: dict = {"messages": []}
    assert ask(body, True) and body == {"messages": [], "return_tokens_as_token_ids": True, "vllm_xargs": {KEY: 1}}
    body = {"vllm_xargs": {"mine": "x"}}
    assert ask(body, True) and body["vllm_xargs"] == {"mine": "x", KEY: 1}
    for asked in ({"logprobs": True}, {"top_logprobs": 2}, {"return_tokens_as_token_ids": False}, {"vllm_xargs": "odd"}):
        body = dict(asked)
        assert not ask(body, True) and body == asked
    body = {"logprobs": False}
    assert ask(body, True) and body["return_tokens_as_token_ids"] is True
    body = {}
    assert not ask(body, False) and body == {}


class VllmLikeUpstream:
    """The proxy's upstream: each body answered by vllm_answer (real vLLM code, TEST DOUBLE tokens);
    ``bodies`` the requests it got, ``answers[id]`` what it answered."""

    def __init__(self, tokenizer) -> None:
        self.bodies: list[dict] = []
        self.answers: dict[str, dict] = {}
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)
            out = vllm_answer(body, tokenizer, len(self.bodies))
            self.answers[out["id"]] = out
            return out

        import uvicorn

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True)

    def __enter__(self) -> "VllmLikeUpstream":
        self._thread.start()
        end = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < end and self._thread.is_alive(), "the upstream did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


@pytest.fixture(scope="module")
def upstream(tokenizer):
    with VllmLikeUpstream(tokenizer) as up:
        yield up


def _chat(px: Proxy, **kw) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, **kw}
    req = urllib.request.Request(px.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _experience_logprobs(px: Proxy) -> dict[str, list[float]]:
    """msg_id -> the logprobs of the experience the proxy recorded (Trinity's own deserializer)."""
    from trinity.common.experience import Experience

    con = sqlite3.connect(f"file:{px.db}?mode=ro", uri=True)
    try:
        rows = con.execute("select h.msg_id, b.experience_bytes from proxy_history h "
                           "join proxy_history_blob b on b.id = h.id").fetchall()
    finally:
        con.close()
    return {m: [round(float(x), 4) for x in Experience.deserialize(b).logprobs] for m, b in rows}


@pytest.mark.parametrize("switch", ["1", "0"])
def test_proxy_request_and_experience(switch, monkeypatch, tmp_path, upstream):
    monkeypatch.setenv(PROXY_VAR, switch)
    px = Proxy(upstream.base_url, tmp_path / f"lean{switch}", None)
    try:
        start = len(upstream.bodies)
        plain = _chat(px)
        asked = _chat(px, logprobs=True)
        mine = _chat(px, vllm_xargs={"mine": "x"})
        sent = upstream.bodies[start:]
        assert all(b["logprobs"] is True and b["return_token_ids"] is True for b in sent)  # the experience's fields
        if switch == "1":
            assert sent[0]["return_tokens_as_token_ids"] is True and sent[0]["vllm_xargs"] == {KEY: 1}
            assert sent[2]["vllm_xargs"] == {"mine": "x", KEY: 1}
            content = plain["choices"][0]["logprobs"]["content"]
            assert [x["token"] for x in content] == [f"token_id:{i}" for i in plain["choices"][0]["token_ids"]]
            assert all(x["bytes"] is None for x in content)
        else:
            assert "return_tokens_as_token_ids" not in sent[0] and "vllm_xargs" not in sent[0]
            assert sent[2]["vllm_xargs"] == {"mine": "x"}
            assert not any(x["token"].startswith("token_id:") for x in plain["choices"][0]["logprobs"]["content"])
        # a client that asks for logprobs gets upstream's request and decoded tokens either way
        assert "return_tokens_as_token_ids" not in sent[1] and "vllm_xargs" not in sent[1]
        assert not any(x["token"].startswith("token_id:") for x in asked["choices"][0]["logprobs"]["content"])
        # the experience holds the engine's numbers, whatever the request's form
        exp = _experience_logprobs(px)
        for answer in (plain, asked, mine):
            want = [round(x["logprob"], 4) for x in upstream.answers[answer["id"]]["choices"][0]["logprobs"]["content"]]
            assert exp[answer["id"]] == want and len(want) == 12
    finally:
        px.stop()


def test_a_bad_proxy_switch_stops_the_proxy_with_a_sentence(monkeypatch, tmp_path, upstream):
    monkeypatch.setenv(PROXY_VAR, "yes")
    with pytest.raises(RuntimeError, match="the proxy exited") as e:
        Proxy(upstream.base_url, tmp_path / "bad", None)
    assert f"{PROXY_VAR} must be 1" in str(e.value)
