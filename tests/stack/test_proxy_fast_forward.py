"""patches/trinity-proxy-fast-forward.patch: Trinity's proxy forwards a non-streamed completion with
aiohttp, parses it once for its experience and returns the upstream's bytes as they came; the
experience is still committed before the response is returned. RFTSTACK_PROXY_FAST_FORWARD=0
restores upstream's forwarding (the response rebuilt through a dict and JSONResponse).

Real: Trinity's installed proxy app (with the policy's patches, `rftstack relax`), uvicorn,
ExplorerService's record code and its SQLite HistoryRecorder, in a child process
(tests/doubles/trinity_proxy_host.py). TEST DOUBLE: the upstream vLLM server (a FastAPI app here
that answers with indented JSON, so bytes passed through and bytes rebuilt tell apart, and answers
500 for the message "fail").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from proxy_helpers import Proxy, free_port

VAR = "RFTSTACK_PROXY_FAST_FORWARD"


class IndentedUpstream:
    """TEST DOUBLE of vLLM's chat endpoint: token ids and logprobs, the JSON indented; ``sent[id]`` is
    the exact bytes of each answer, ``bodies`` the requests it got."""

    def __init__(self) -> None:
        self.sent: dict[str, bytes] = {}
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)
            if body["messages"][0]["content"] == "fail":
                return Response(status_code=500, content=b'{"error": {"message": "planned failure"}}', media_type="application/json")
            rid = f"chatcmpl-{len(self.bodies)}"
            n = int(body.get("max_tokens", 4))
            out = {"id": rid, "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2, 3],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * n}, "finish_reason": "length",
                                "token_ids": list(range(10, 10 + n)),
                                "logprobs": {"content": [{"token": "x", "logprob": -0.25 * (i + 1)} for i in range(n)]}}]}  # fmt: skip
            self.sent[rid] = raw = json.dumps(out, indent=1).encode()
            return Response(content=raw, media_type="application/json")

        import uvicorn

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True)

    def __enter__(self) -> "IndentedUpstream":
        self._thread.start()
        end = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < end and self._thread.is_alive(), "the upstream double did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


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
        status, raw = chat(px, "fail")
        assert (status, json.loads(raw)) == (500, {"error": {"message": "planned failure"}})
    finally:
        px.stop()


def test_fast_unreachable_upstream_is_a_502_as_upstream(monkeypatch, tmp_path):
    px = proxy(monkeypatch, tmp_path, f"http://127.0.0.1:{free_port()}", "1")  # nothing listens there
    try:
        status, raw = chat(px, "case 502")
        assert status == 502
        assert json.loads(raw)["error"]["type"] == "upstream_connection_error"
        assert px.rows() == []
    finally:
        px.stop()


def test_a_bad_switch_value_stops_the_proxy_with_a_sentence(monkeypatch, tmp_path, upstream):
    with pytest.raises(RuntimeError, match="the proxy exited") as e:
        proxy(monkeypatch, tmp_path, upstream.base_url, "yes")
    assert f"{VAR} must be 1" in str(e.value)


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
