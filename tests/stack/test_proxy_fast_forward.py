"""patches/trinity-proxy-fast-forward.patch: Trinity's proxy forwards a non-streamed completion with
aiohttp, parses it once for its experience and returns the upstream's bytes as they came; the
experience is still committed before the response is returned. RFTSTACK_PROXY_FAST_FORWARD=0
restores upstream's forwarding (the response rebuilt through a dict and JSONResponse).

Real: Trinity's installed proxy app (with the policy's patches, `rftstack relax`), uvicorn,
ExplorerService's record code and its SQLite HistoryRecorder, in a child process
(tests/doubles/trinity_proxy_host.py). TEST DOUBLE: the upstream vLLM server (a FastAPI app here
that answers with indented JSON, so bytes passed through and bytes rebuilt tell apart, with its own
date and server headers, records the headers it receives, answers 500 for the message "fail" and a
400 carrying FastAPI's File/line context for "traceback").

The fast path keeps trinity-proxy-request-hygiene.patch's guarantees (that patch comes first in the
policy): no hop-by-hop or credential header reaches the engine, the body goes as application/json
whatever the client's label, errors are OpenAI-shaped without tracebacks, and the client gets one
date and one server header (uvicorn's); test_request_hygiene_holds_on_both_paths runs them with the
switch at 1 and at 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import sqlite3
import urllib.error
import urllib.request

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from proxy_helpers import InThreadServer, Proxy, assert_bad_switch_stops_the_proxy, free_port

VAR = "RFTSTACK_PROXY_FAST_FORWARD"
ENGINE_DATE = "Mon, 01 Jan 2024 00:00:00 GMT"
# what vLLM 0.23's 400 handler sends for a request FastAPI refused: the message with its File/line context
TRACEBACK_MESSAGE = ("1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}\n"
                     '\n  File "/srv/vllm/entrypoints/openai/api_server.py", line 612, in create_chat_completion\n'
                     "    POST /v1/chat/completions")


class IndentedUpstream(InThreadServer):
    """TEST DOUBLE of vLLM's chat endpoint: token ids and logprobs, the JSON indented; ``sent[id]`` is
    the exact bytes of each answer, ``bodies`` the requests it got."""

    def __init__(self) -> None:
        self.sent: dict[str, bytes] = {}
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []
        app = FastAPI()
        own = {"server": "vllm-double", "date": ENGINE_DATE}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if body["messages"][0]["content"] == "fail":
                return Response(status_code=500, content=b'{"error": {"message": "planned failure"}}', media_type="application/json")
            if body["messages"][0]["content"] == "traceback":
                return Response(status_code=400, content=json.dumps({"error": {"message": TRACEBACK_MESSAGE, "type": "BadRequestError",
                                                                              "code": 400}}).encode(), media_type="application/json", headers=own)
            rid = f"chatcmpl-{len(self.bodies)}"
            n = int(body.get("max_tokens", 4))
            out = {"id": rid, "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2, 3],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * n}, "finish_reason": "length",
                                "token_ids": list(range(10, 10 + n)),
                                "logprobs": {"content": [{"token": "x", "logprob": -0.25 * (i + 1)} for i in range(n)]}}]}  # fmt: skip
            self.sent[rid] = raw = json.dumps(out, indent=1).encode()
            return Response(content=raw, media_type="application/json", headers=own)

        super().__init__(app, server_header=False, date_header=False)


@pytest.fixture(scope="module")
def upstream():
    with IndentedUpstream() as up:
        yield up


def proxy(monkeypatch, tmp_path, upstream_url: str, fast: str) -> Proxy:
    monkeypatch.setenv(VAR, fast)
    return Proxy(upstream_url, tmp_path / f"fast{fast}", None)


def chat(px: Proxy, content: str, max_tokens: int = 4) -> tuple[int, bytes]:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0.3}
    req = urllib.request.Request(px.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def recorded(px: Proxy, msg_id: str) -> bool:
    con = sqlite3.connect(f"file:{px.db}?mode=ro", uri=True)
    try:
        return con.execute("select count(*) from proxy_history where msg_id = ?", (msg_id,)).fetchone()[0] == 1
    finally:
        con.close()


def test_switch_values_and_the_parser_fallback():
    from trinity.explorer.proxy import app

    assert app.FAST_FORWARD_VAR == VAR, "the installed Trinity lacks the fast-forward patch: run `rftstack relax`"
    assert app.fast_forward_enabled({}) is True
    assert app.fast_forward_enabled({VAR: "0"}) is False
    with pytest.raises(ValueError, match=VAR):
        app.fast_forward_enabled({VAR: "yes"})
    # orjson refuses NaN; the standard library (what upstream's resp.json() used) accepts it
    assert math.isnan(app._fast_loads(b'{"logprob": NaN}')["logprob"])
    with pytest.raises(ValueError):
        app._fast_loads(b"not json")


def test_fast_returns_the_upstream_bytes_each_recorded_before_it_returns(monkeypatch, tmp_path, upstream):
    px = proxy(monkeypatch, tmp_path, upstream.base_url, "1")
    try:
        def one(i: int) -> tuple[bytes, bool]:
            status, raw = chat(px, f"case {i}", max_tokens=3 + i)
            assert status == 200, raw
            return raw, recorded(px, json.loads(raw)["id"])  # read the store as soon as the answer is here

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(16)))
        for raw, was_recorded in answers:
            assert raw == upstream.sent[json.loads(raw)["id"]]  # byte for byte: not rebuilt
            assert was_recorded
        # the request was still rewritten as Trinity does: token ids, logprobs, its temperature
        assert all(b["return_token_ids"] is True and b["logprobs"] is True and b["temperature"] == 0.0 for b in upstream.bodies)
        status, raw = chat(px, "fail")
        assert (status, json.loads(raw)) == (500, {"error": {"message": "planned failure"}})
        assert len(px.rows()) == 16
    finally:
        px.stop()


def test_switch_off_rebuilds_the_response_as_upstream(monkeypatch, tmp_path, upstream):
    px = proxy(monkeypatch, tmp_path, upstream.base_url, "0")
    try:
        status, raw = chat(px, "case off")
        assert status == 200
        data = json.loads(raw)
        assert raw != upstream.sent[data["id"]] and data == json.loads(upstream.sent[data["id"]])  # same JSON, re-encoded
        assert recorded(px, data["id"])
        # upstream's path also samples at the config's temperature, not the request's 0.3 (docs/serve.md, Clients)
        assert [b["temperature"] for b in upstream.bodies if b["messages"][0]["content"] == "case off"] == [0.0]
        status, raw = chat(px, "fail")
        assert (status, json.loads(raw)) == (500, {"error": {"message": "planned failure"}})
    finally:
        px.stop()


def test_fast_unreachable_upstream_is_a_502_as_upstream(monkeypatch, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    px = proxy(monkeypatch, tmp_path, nowhere, "1")
    try:
        status, raw = chat(px, "case 502")
        assert status == 502
        error = json.loads(raw)["error"]
        assert error["type"] == "upstream_connection_error" and "Traceback" not in error["message"]
        # request hygiene's words, as for httpx's ConnectError on the path without the patch
        assert error["message"].startswith(f"Failed to connect upstream model at {nowhere}: ConnectError: ")
        assert px.rows() == []
    finally:
        px.stop()


def test_a_bad_switch_value_stops_the_proxy_with_a_sentence(monkeypatch, tmp_path, upstream):
    assert_bad_switch_stops_the_proxy(monkeypatch, tmp_path / "fastyes", upstream.base_url, VAR)


def test_the_session_to_the_engine_as_documented():
    """docs/serve.md: at most 100 connections (httpx's pool), no cookie jar, bodies left for httpx to decode."""
    import aiohttp

    from trinity.explorer.proxy import app as app_mod

    async def check() -> None:
        async with app_mod.lifespan(app_mod.app):
            session = app_mod.app.state.fast_session
            assert app_mod.app.state.fast_forward is True
            assert session.connector.limit == 100
            assert isinstance(session.cookie_jar, aiohttp.DummyCookieJar)
            assert session.auto_decompress is False
        assert session.closed  # closed with the app

    asyncio.run(check())


HOSTILE = {"authorization": "Bearer secret", "cookie": "session=1", "connection": "Upgrade, HTTP2-Settings, X-Hop",
           "upgrade": "h2c", "http2-settings": "AAMAAABkAAQCAAAAAAIAAAAA", "keep-alive": "timeout=5", "te": "trailers",
           "trailer": "x-t", "proxy-authorization": "Basic x", "x-hop": "1", "x-agent": "kept"}


@pytest.mark.parametrize("fast", ["1", "0"], ids=["fast-forward", "switch-off"])
def test_request_hygiene_holds_on_both_paths(monkeypatch, tmp_path, upstream, fast):
    """trinity-proxy-request-hygiene.patch's guarantees through the whole chain, with the fast path
    on (the default) and off: the same answers either way."""
    px = proxy(monkeypatch, tmp_path, upstream.base_url, fast)
    body = {"model": "m", "messages": [{"role": "user", "content": "hygiene"}], "max_tokens": 3}
    try:
        with httpx.Client(base_url=px.base, timeout=60) as c:
            # a JSON body labelled text/plain (Node's fetch without headers) and every header the engine must not get
            r = c.post("/v1/chat/completions", content=json.dumps(body).encode(), headers={**HOSTILE, "content-type": "text/plain;charset=UTF-8"})
            assert r.status_code == 200, r.text
            sent = upstream.headers[-1]
            for h in ("authorization", "cookie", "upgrade", "http2-settings", "keep-alive", "te", "trailer", "proxy-authorization", "x-hop"):
                assert h not in sent, (h, sent)
            assert sent["content-type"] == "application/json" and sent["x-agent"] == "kept"
            assert r.headers.get_list("server") == ["uvicorn"]  # the proxy's own, not the engine's as well
            dates = r.headers.get_list("date")
            assert len(dates) == 1 and dates != [ENGINE_DATE]
            if fast == "1":
                assert r.content == upstream.sent[r.json()["id"]]  # still the engine's bytes
            assert recorded(px, r.json()["id"])
            # an engine error: OpenAI's shape, its message without the File/line context
            r = c.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "traceback"}]})
            error = r.json()["error"]
            assert r.status_code == 400 and "Field required" in error["message"]
            assert 'File "' not in error["message"] and "Traceback" not in error["message"]
            assert r.headers.get_list("server") == ["uvicorn"] and len(r.headers.get_list("date")) == 1
            # a body that is not a JSON object: one OpenAI error, nothing forwarded or recorded
            forwarded = len(upstream.bodies)
            r = c.post("/v1/chat/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
            assert r.status_code == 400 and set(r.json()) == {"error"} and "not an object" in r.json()["error"]["message"]
            assert len(upstream.bodies) == forwarded
        assert len(px.rows()) == 1
    finally:
        px.stop()
