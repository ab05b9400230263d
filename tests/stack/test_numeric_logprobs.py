"""patches/vllm-logprobs-numeric.patch and patches/trinity-proxy-numeric-logprobs.patch: when a client asks
for no logprobs and no stream, Trinity's proxy asks the engine for the sampled tokens' logprobs as numbers
(vllm_xargs.rftstack_logprobs_numeric); vLLM's logprobs processor then keeps one float per token and its
chat route answers them as the choice's "rftstack_logprobs" with logprobs null; the proxy's experience
takes them from there. The experience (token ids, logprob numbers) is the same as upstream's.
RFTSTACK_PROXY_NUMERIC_LOGPROBS=0 (the proxy) and RFTSTACK_VLLM_NUMERIC_LOGPROBS=0 (vLLM's API server)
restore upstream.

Real: the installed vLLM's ChatCompletionRequest, SamplingParams, EngineCoreRequest, LogprobsProcessor,
CompletionOutput/RequestOutput and OpenAIServingChat.chat_completion_full_generator (the route's whole
non-streamed answer), with the tokenizer of rftstack's bench model; Trinity's installed proxy app with its
SQLite recorder in a child process (tests/proxy_helpers.py). TEST DOUBLE: the engine's sampled token ids
and logprobs (no GPU here). The proxy's upstream is a small server that answers each body it gets with
that real vLLM code, so what a client and the experience get is what vLLM's own code builds.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from patch_helpers import VLLM_RELS
from proxy_helpers import InThreadServer, Proxy, assert_bad_switch_stops_the_proxy
from rftstack.stack import patches, policy

KEY = "rftstack_logprobs_numeric"
PROXY_VAR = "RFTSTACK_PROXY_NUMERIC_LOGPROBS"
VLLM_VAR = "RFTSTACK_VLLM_NUMERIC_LOGPROBS"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from rftstack.run import tinymodel
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tinymodel.write(tmp_path_factory.mktemp("tok") / "tiny")))


def engine_output(vocab: int, n: int, seed: int) -> tuple[list[int], list[float]]:
    """TEST DOUBLE of the engine's output for one request: sampled token ids and their logprobs."""
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)], [round(-rnd.random() * 3, 4) for _ in range(n)]


def processor_for(body: dict, tokenizer, seed: int, route: str = "chat"):
    """vLLM's LogprobsProcessor for the request ``body`` as ``route`` makes it ("chat": with the chat route's
    mark; anything else: the same sampling parameters unmarked, as another route passes them), fed the TEST
    DOUBLE's tokens one engine step at a time (None when the request asks for no logprobs), with the token ids."""
    import numpy as np
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.logprobs import LogprobsProcessor, mark_numeric_logprobs
    from vllm.v1.outputs import LogprobsLists

    req = ChatCompletionRequest(**body)
    n = body.get("max_tokens") or 8
    params = req.to_sampling_params(n, {})
    if route == "chat":
        mark_numeric_logprobs(params)  # what the chat route does next (test_the_chat_route_marks_its_requests)
    core = EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
                             pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None)  # fmt: skip
    ids, lps = engine_output(len(tokenizer), n, seed)
    if params.logprobs is None:
        return None, ids
    proc = LogprobsProcessor.from_new_request(tokenizer, core)
    for tok, lp in zip(ids, lps):
        proc._update_sample_logprobs(LogprobsLists(np.array([[tok]]), np.array([[lp]], dtype=np.float32), np.array([1]), None))
    return proc, ids


def vllm_answer(body: dict, tokenizer, seed: int) -> dict:
    """vLLM's non-streamed chat answer for ``body``: the installed route's chat_completion_full_generator over
    the RequestOutput its output processor would build (the engine's tokens a TEST DOUBLE)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.engine.protocol import RequestResponseMetadata
    from vllm.outputs import CompletionOutput, RequestOutput

    req = ChatCompletionRequest(**body)
    proc, ids = processor_for(body, tokenizer, seed)
    out = CompletionOutput(index=0, text=tokenizer.decode(ids), token_ids=ids, finish_reason="length",
                           cumulative_logprob=proc.cumulative_logprob if proc else None, logprobs=proc.logprobs if proc else None)  # fmt: skip
    final = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1, 2, 3], prompt_logprobs=None, outputs=[out], finished=True)

    async def results():
        yield final
    chat = object.__new__(OpenAIServingChat)  # what the full generator reads; its construction needs an engine
    for k, v in {"tool_call_id_type": "random", "use_harmony": False, "enable_auto_tools": False, "tool_parser": None,
                 "response_role": "assistant", "enable_prompt_tokens_details": False, "enable_force_include_usage": False,
                 "return_tokens_as_token_ids": False, "system_fingerprint": None, "log_error_stack": False,
                 "enable_log_outputs": False, "request_logger": None}.items():  # fmt: skip
        setattr(chat, k, v)
    res = asyncio.run(chat.chat_completion_full_generator(req, results(), f"chatcmpl-{seed}", "m", [], tokenizer,
                                                          RequestResponseMetadata(request_id="r")))  # fmt: skip
    return json.loads(res.model_dump_json())  # what vLLM's route sends (JSONResponse of model_dump)


def _body(**kw) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "logprobs": True,
            "return_token_ids": True, **kw}


# ---- vLLM's side --------------------------------------------------------------------------------


def test_vllm_is_patched_and_the_switch_values():
    from vllm.v1.engine import logprobs

    assert getattr(logprobs, "NUMERIC_KEY", None) == KEY, "the installed vLLM lacks the patch: run `rftstack relax`"
    assert logprobs.numeric_enabled({}) is True
    assert logprobs.numeric_enabled({VLLM_VAR: "0"}) is False
    with pytest.raises(ValueError, match=VLLM_VAR):
        logprobs.numeric_enabled({VLLM_VAR: "no"})


def test_the_published_files_have_no_numeric_path():
    """The patch is what adds the path: the files as published have none, and the patch gives them back."""
    import importlib.util

    site = Path(importlib.util.find_spec("vllm").origin).parents[1]
    (p,) = [p for p in policy.load().patches if p.file == "vllm-logprobs-numeric.patch"]
    fps = patches.parse((patches.patches_dir() / p.file).read_text())
    assert sorted(fp.path for fp in fps) == sorted(VLLM_RELS)
    for fp in fps:
        text = (site / fp.path).read_text()
        published = patches.undo(text, patches.patches_dir() / p.file, fp.path)
        assert "NumericLogprobs" not in published and KEY not in published and "rftstack" not in published
        assert patches.apply_text(published, fp)[0] == text


def test_numeric_answer_same_numbers_no_objects(tokenizer):
    upstream = vllm_answer(_body(), tokenizer, 7)
    numeric = vllm_answer(_body(vllm_xargs={KEY: 1}), tokenizer, 7)
    u, n = upstream["choices"][0], numeric["choices"][0]
    assert n["token_ids"] == u["token_ids"] and len(n["token_ids"]) == 24
    assert n["logprobs"] is None and "rftstack_logprobs" not in u
    assert n["rftstack_logprobs"] == [x["logprob"] for x in u["logprobs"]["content"]]  # the same float32 values
    assert n["message"] == u["message"] and numeric["prompt_token_ids"] == upstream["prompt_token_ids"] == [1, 2, 3]
    assert numeric["usage"] == upstream["usage"]
    # the processor: one float per token, the same cumulative logprob, no tokenizer
    from vllm.v1.engine.logprobs import NumericLogprobs

    pn, _ = processor_for(_body(vllm_xargs={KEY: 1}), tokenizer, 7)
    pu, _ = processor_for(_body(), tokenizer, 7)
    assert isinstance(pn.logprobs, NumericLogprobs) and pn.tokenizer is None
    assert pn.cumulative_logprob == pytest.approx(pu.cumulative_logprob, abs=1e-9)
    assert len(json.dumps(numeric)) < len(json.dumps(upstream)) / 2


@pytest.mark.parametrize("why, kw", [
    ("no key", {}),
    ("top_logprobs", {"top_logprobs": 2, "vllm_xargs": {KEY: 1}}),
    ("a stream (vLLM's DELTA output)", {"stream": True, "vllm_xargs": {KEY: 1}}),
    ("prompt logprobs", {"prompt_logprobs": 1, "vllm_xargs": {KEY: 1}}),
    ("a false key", {"vllm_xargs": {KEY: 0}}),
])
def test_any_other_request_is_upstreams(tokenizer, why, kw):
    from vllm.v1.engine.logprobs import NumericLogprobs

    proc, _ = processor_for(_body(**kw), tokenizer, 3)
    assert not isinstance(proc.logprobs, NumericLogprobs) and proc.tokenizer is tokenizer, why
    if not kw.get("stream"):
        choice = vllm_answer(_body(**kw), tokenizer, 3)["choices"][0]
        assert "rftstack_logprobs" not in choice and len(choice["logprobs"]["content"]) == 24, why


def test_the_chat_route_marks_its_requests():
    """The chat route (_create_chat_completion) marks the sampling parameters right after making them (its run
    needs an engine: the source is read); the mark is bytes, so no JSON body can set it."""
    import inspect

    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.v1.engine import logprobs

    src = inspect.getsource(OpenAIServingChat._create_chat_completion)
    made = src.index("sampling_params = request.to_sampling_params(")
    call_end = src.index(")\n", made)  # the call's closing parenthesis
    assert src[call_end + 1:].lstrip().startswith("mark_numeric_logprobs(sampling_params)")
    assert isinstance(logprobs.NUMERIC_CHAT, bytes)
    assert json.loads(json.dumps({KEY: 1})) != {KEY: logprobs.NUMERIC_CHAT}


def test_the_key_on_another_route_changes_nothing(tokenizer):
    """The same sampling parameters without the chat route's mark (e.g. /v1/completions' vllm_xargs): upstream."""
    from vllm.v1.engine.logprobs import NumericLogprobs

    proc, _ = processor_for(_body(vllm_xargs={KEY: 1}), tokenizer, 3, route="completions")
    assert not isinstance(proc.logprobs, NumericLogprobs) and proc.tokenizer is tokenizer


def test_a_marked_request_crosses_to_the_engine_core():
    """The mark (bytes in extra_args) survives vLLM's own msgpack encoding of the EngineCoreRequest, which
    carries each request from the API server to the EngineCore process."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.logprobs import NUMERIC_CHAT, mark_numeric_logprobs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    params = ChatCompletionRequest(**_body(vllm_xargs={KEY: 1, "mine": "x"})).to_sampling_params(8, {})
    mark_numeric_logprobs(params)
    core = EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
                             pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None)  # fmt: skip
    back = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(core))
    assert back.sampling_params.extra_args == {KEY: NUMERIC_CHAT, "mine": "x"}


def test_the_vllm_switch_at_0_ignores_the_key(tokenizer, monkeypatch):
    from vllm.v1.engine import logprobs

    monkeypatch.setattr(logprobs, "_NUMERIC", False)
    choice = vllm_answer(_body(vllm_xargs={KEY: 1}), tokenizer, 7)["choices"][0]
    assert "rftstack_logprobs" not in choice and len(choice["logprobs"]["content"]) == 24


def test_vllm_switch_is_read_at_import_and_a_bad_value_stops_it():
    code = "from vllm.v1.engine import logprobs as l; print(l._NUMERIC)"
    for value, expect in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env={"PATH": "/usr/bin:/bin", VLLM_VAR: value})  # fmt: skip
        assert out.returncode == 0 and out.stdout.split()[-1] == expect, out.stderr[-2000:]  # vLLM logs to stdout too
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", VLLM_VAR: "yes"})  # fmt: skip
    assert bad.returncode != 0 and f"{VLLM_VAR} must be 1" in bad.stderr


# ---- the proxy's side ---------------------------------------------------------------------------


def test_proxy_marks_only_unstreamed_requests_without_logprobs():
    from trinity.explorer.proxy import app

    assert getattr(app, "NUMERIC_LOGPROBS_VAR", None) == PROXY_VAR, "the installed Trinity lacks the patch: run `rftstack relax`"
    assert app.NUMERIC_KEY == KEY
    assert app.numeric_logprobs_enabled({}) is True and app.numeric_logprobs_enabled({PROXY_VAR: "0"}) is False
    with pytest.raises(ValueError, match=PROXY_VAR):
        app.numeric_logprobs_enabled({PROXY_VAR: "true"})
    ask = app._ask_numeric_logprobs
    body: dict = {"messages": []}
    assert ask(body, True) and body == {"messages": [], "vllm_xargs": {KEY: 1}}
    body = {"vllm_xargs": {"mine": "x"}, "logprobs": False, "stream": False}
    assert ask(body, True) and body["vllm_xargs"] == {"mine": "x", KEY: 1}
    for asked in ({"logprobs": True}, {"top_logprobs": 2}, {"stream": True}, {"vllm_xargs": "odd"}):
        body = dict(asked)
        assert not ask(body, True) and body == asked
    body = {}
    assert not ask(body, False) and body == {}


class VllmLikeUpstream(InThreadServer):
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
            out = await asyncio.to_thread(vllm_answer, body, tokenizer, len(self.bodies))
            self.answers[out["id"]] = out
            return out

        super().__init__(app)


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


def _experiences(px: Proxy) -> dict[str, tuple[list[int], list[float]]]:
    """msg_id -> (tokens, logprobs) of the experience the proxy recorded (Trinity's own deserializer)."""
    from trinity.common.experience import Experience

    con = sqlite3.connect(f"file:{px.db}?mode=ro", uri=True)
    try:
        rows = con.execute("select h.msg_id, b.experience_bytes from proxy_history h "
                           "join proxy_history_blob b on b.id = h.id").fetchall()
    finally:
        con.close()
    out = {}
    for m, b in rows:
        e = Experience.deserialize(b)
        out[m] = ([int(t) for t in e.tokens], [float(x) for x in e.logprobs])
    return out


@pytest.mark.parametrize("switch", ["1", "0"])
def test_proxy_request_answer_and_experience(switch, monkeypatch, tmp_path, upstream):
    monkeypatch.setenv(PROXY_VAR, switch)
    px = Proxy(upstream.base_url, tmp_path / f"numeric{switch}", None)
    try:
        start = len(upstream.bodies)
        plain = _chat(px)
        asked = _chat(px, logprobs=True)
        mine = _chat(px, vllm_xargs={"mine": "x"})
        sent = upstream.bodies[start:]
        assert all(b["logprobs"] is True and b["return_token_ids"] is True for b in sent)  # the experience's fields
        if switch == "1":
            assert sent[0]["vllm_xargs"] == {KEY: 1} and sent[2]["vllm_xargs"] == {"mine": "x", KEY: 1}
            assert plain["choices"][0]["logprobs"] is None and len(plain["choices"][0]["rftstack_logprobs"]) == 12
        else:
            assert "vllm_xargs" not in sent[0] and sent[2]["vllm_xargs"] == {"mine": "x"}
            assert "rftstack_logprobs" not in plain["choices"][0] and len(plain["choices"][0]["logprobs"]["content"]) == 12
        # a client that asks for logprobs gets upstream's request and answer either way
        assert "vllm_xargs" not in sent[1] and len(asked["choices"][0]["logprobs"]["content"]) == 12
        # the experience: the prompt's and the answer's token ids, the engine's numbers, whatever the form
        exp = _experiences(px)
        for answer in (plain, asked, mine):
            choice = upstream.answers[answer["id"]]["choices"][0]
            want = choice.get("rftstack_logprobs") or [x["logprob"] for x in choice["logprobs"]["content"]]
            tokens, lps = exp[answer["id"]]
            assert tokens == [1, 2, 3, *choice["token_ids"]]
            assert lps == pytest.approx(want, abs=1e-6) and len(want) == 12
    finally:
        px.stop()


def test_a_bad_proxy_switch_stops_the_proxy_with_a_sentence(monkeypatch, tmp_path, upstream):
    assert_bad_switch_stops_the_proxy(monkeypatch, tmp_path / "bad", upstream.base_url, PROXY_VAR)
