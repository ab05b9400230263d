"""Bad requests to Trinity's real proxy app (trinity/explorer/proxy/app.py), in-process.

Real: the FastAPI app, ExplorerService.record_experience / record_feedback (Trinity's code) and its
SQLite HistoryRecorder. TEST DOUBLES: the upstream vLLM server (an in-process ASGI app answering
what vLLM 0.23 answers, messages copied from vllm/entrypoints/openai/engine/serving.py and
vllm/renderers/params.py; the GPU test checks them against real vLLM) and the service's model
allocation (one upstream, no engines). The /feedback cases run against the app with
patches/trinity-proxy-feedback-errors.patch applied in a private copy of the module, and against
the installed app, so both the fixed and the original behaviour are on record.
"""

from __future__ import annotations

import asyncio
import json

import pytest


httpx = pytest.importorskip("httpx")
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from helpers import REPO  # noqa: E402
from proxy_helpers import Service, load_app  # noqa: E402

MAX_LEN = 2048


def upstream_double() -> FastAPI:
    """TEST DOUBLE of vLLM's OpenAI server: model name and max_tokens checks as vLLM words them."""
    up = FastAPI()

    @up.post("/v1/chat/completions")
    async def chat(body: dict):
        if body.get("model") != "m":
            return JSONResponse(status_code=404, content={"error": {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}})
        if body.get("max_tokens", 16) > MAX_LEN:
            # vLLM 0.23's renderers/params.py, as the GPU host returned it through the patched proxy (session AJ,
            # docs/gpu-logs/2026-12-06aj/bad-1.log)
            msg = (f"max_tokens={body['max_tokens']} cannot be greater than max_model_len=max_total_tokens={MAX_LEN}. "
                   f"Please request fewer output tokens. (parameter=max_tokens, value={body['max_tokens']})")
            return JSONResponse(status_code=400, content={"error": {"message": msg, "type": "BadRequestError", "param": "max_tokens", "code": 400}})
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2, 3],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": [4, 5],
                             "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}, "finish_reason": "stop"}]}  # fmt: skip

    return up


async def exchange(app_mod, service, requests):
    app = app_mod.app
    app.state.service, app.state.temperature, app.state.inference_timeout = service, 1.0, 30
    app.state.models_cache = None
    app.state.http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream_double()))
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://proxy") as c:
        for path, body in requests:
            kw = {"content": body} if isinstance(body, (str, bytes)) else {"json": body}
            r = await c.post(path, headers={"content-type": "application/json"}, **kw)
            out.append((r.status_code, r.text))
    await app.state.http_client.aclose()
    return out


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
REQUESTS = [
    ("/v1/chat/completions", "{not json"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10**9}),
    ("/v1/chat/completions", CHAT),  # a good one: recorded as chatcmpl-1
    ("/feedback", "{not json"),
    ("/feedback", [1, 2]),
    ("/feedback", {"msg_ids": ["chatcmpl-unknown"], "reward": 1.0}),
    ("/feedback", {"msg_ids": "chatcmpl-1", "reward": 1.0}),
    ("/feedback", {"msg_ids": ["chatcmpl-1"]}),
    ("/feedback", {"msg_ids": ["chatcmpl-1"], "reward": 1.0}),
    ("/feedback", {"msg_ids": ["chatcmpl-1"], "reward": 1.0}),  # the same again: already rewarded
]


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    out = {}
    for patched in (False, True):
        tmp = tmp_path_factory.mktemp("patched" if patched else "orig")
        app_mod, service_mod = load_app(patched, tmp)
        service = Service(service_mod, tmp / "proxy_history.db")
        out[patched] = (asyncio.run(exchange(app_mod, service, REQUESTS)), service, tmp / "proxy_history.db")
    return out


def test_chat_bad_requests_are_4xx_with_a_sentence(answers):
    got, service, db = answers[True]
    # trinity-proxy-request-hygiene.patch: one error in OpenAI's shape (it was FastAPI's {"detail": "Invalid JSON: ..."})
    assert got[0][0] == 400 and json.loads(got[0][1])["error"]["message"].startswith("the request body is not valid JSON (Expecting property name enclosed in double quotes")
    assert got[1] == (404, json.dumps({"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}}, separators=(",", ":")))
    assert got[2][0] == 400 and json.loads(got[2][1])["error"]["message"] == (
        "max_tokens=1000000000 cannot be greater than max_model_len=max_total_tokens=2048. Please request fewer output tokens. "
        "(parameter=max_tokens, value=1000000000)")  # vLLM's words, passed through unchanged
    assert got[3][0] == 200
    # only the good request was recorded: failed ones leave no experience behind
    import sqlite3

    assert sqlite3.connect(db).execute("select count(*) from proxy_history").fetchone()[0] == 1


def test_feedback_original_answers_500_and_silent_200(answers):
    got = [code for code, _ in answers[False][0][4:]]
    assert got == [500, 500, 200, 400, 400, 200, 200]


def test_feedback_patched_answers_400_and_404(answers):
    got, service, _ = answers[True]
    fb = [(code, json.loads(text)) for code, text in got[4:]]
    assert fb[0][0] == 400 and fb[0][1]["error"].startswith("the body is not valid JSON (Expecting property name")
    assert fb[1] == (400, {"error": "the body must be a JSON object with msg_ids and reward"})
    nomatch = {"error": "none of msg_ids is a recorded response still waiting for feedback; send the id of a response this proxy returned, once"}
    assert fb[2] == (404, nomatch)
    assert fb[3] == (400, {"error": "msg_ids must be a list and reward must be a number"})
    assert fb[4] == (400, {"error": "msg_ids and reward are required"})
    assert fb[5] == (200, {"status": "success", "updated": 1})
    assert fb[6] == (404, nomatch)
    assert service.ready_experience_count == 1  # nothing recorded twice, nothing lost


def test_the_reliability_table_quotes_these_answers(answers):
    """docs/reliability.md's chat rows say what the patched proxy answers: the texts this file's exchange got."""
    got, _, _ = answers[True]
    rows = {line.split(" | ")[0]: line for line in (REPO / "docs" / "reliability.md").read_text().splitlines()}
    assert f"400 `{json.loads(got[2][1])['error']['message']}`" in rows["| chat: huge max_tokens"]
    row = rows["| chat: invalid JSON"]
    message = json.loads(got[0][1])["error"]["message"]
    head, _, tail = message.partition("(Expecting property name enclosed in double quotes")
    after = tail[tail.index("); ") + 1:]  # the error's own text ends with "(char 1))"
    assert f"`{head}(Expecting property name enclosed in double quotes: ...){after}`" in row
    # the row's "original" (FastAPI's {"detail": "Invalid JSON: ..."}): test_proxy_request_hygiene.py, as published
