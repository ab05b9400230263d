"""uvicorn's httptools protocol and requests that offer an upgrade it does not take (h2c).

Guards an upstream behaviour (uvicorn #2722, httptools #124): uvicorn 0.54.0's httptools protocol,
as published, gives the application an EMPTY body for a request offering `Upgrade: h2c` (what the
JDK's default HttpClient and `curl --http2` send on every cleartext request). Each case runs
against a real uvicorn on a free loopback port, over raw sockets, twice: with
patches/uvicorn-httptools-ignore-upgrade.patch (the body arrives whole, the connection stays
usable, a truncated body is a 400) and as published (the body is lost), so the test shows both.
Nothing is a double: the application is a plain ASGI echo.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
from pathlib import Path

import pytest
import uvicorn

import uvicorn_helpers
from proxy_helpers import InThreadServer

OFFER = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 3000}]}).encode()


async def echo(scope, receive, send):
    """Answers with what it read: the body, its length, and the request headers."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        msg = await receive()
        await send({"type": "websocket.send", "text": "echo " + msg.get("text", "")})
        await send({"type": "websocket.close"})
        return
    body, more = b"", True
    while more:
        m = await receive()
        if m["type"] == "http.disconnect":
            return
        body += m.get("body", b"")
        more = m.get("more_body", False)
    out = json.dumps({"len": len(body), "sha": hashlib.sha256(body).hexdigest(),
                      "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]]}).encode()  # fmt: skip
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


class Server(InThreadServer):
    """A real uvicorn.Server in a thread, on a free loopback port, with the given protocol class."""

    def __init__(self, protocol: type):
        super().__init__(echo, http=protocol, lifespan="off")


@pytest.fixture(scope="module", params=[True, False], ids=["patched", "published"])
def server(request, tmp_path_factory):
    with Server(uvicorn_helpers.httptools_protocol(request.param, tmp_path_factory.mktemp("uvicorn"))) as s:
        s.patched = request.param
        yield s


class Conn:
    """One client connection; reads HTTP/1.1 responses with a Content-Length."""

    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, *parts: bytes, gap: float = 0.05) -> None:
        """Each part in its own write, ``gap`` seconds apart (separate TCP segments)."""
        for i, p in enumerate(parts):
            if i:
                time.sleep(gap)
            self.s.sendall(p)

    def response(self) -> tuple[int, dict, bytes]:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a response; got {self.buf!r}")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(lines[0].split()[1]), headers, body

    def close(self) -> None:
        self.s.close()


def post_head(length: int | None, offer: bool = True) -> bytes:
    framing = b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (OFFER if offer else b"") + b"Content-Type: application/json\r\n" + framing + b"\r\n"


def chunked(data: bytes, size: int) -> list[bytes]:
    parts = [b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size]) for i in range(0, len(data), size)]
    return parts + [b"0\r\n\r\n"]


def roundtrip(c: Conn, *parts: bytes) -> tuple[int | None, bytes]:
    """(status, body) of one exchange; (None, b"") when the server closed the connection instead."""
    try:
        c.send(*parts)
        status, _, got = c.response()
        return status, got
    except (BrokenPipeError, ConnectionError):
        return None, b""


def expect_body(server: Server, answer: tuple[int | None, bytes], body: bytes = BODY) -> None:
    """Patched: 200 and the app read ``body`` whole. As published (the upstream behaviour the patch
    fixes): the app read nothing (b"") or the body was parsed as the next request (400, closed)."""
    status, got = answer
    if server.patched:
        assert status == 200, got
        seen = json.loads(got)
        assert (seen["len"], seen["sha"]) == (len(body), hashlib.sha256(body).hexdigest())
    else:
        assert status != 200 or json.loads(got)["len"] == 0, got


def test_content_length_body_in_one_packet(server):
    c = Conn(server.port)
    status, got = roundtrip(c, post_head(len(BODY)) + BODY)
    expect_body(server, (status, got))
    headers = dict(json.loads(got)["headers"])
    assert headers["upgrade"] == "h2c" and headers["connection"] == "Upgrade, HTTP2-Settings"  # as sent
    c.close()


def test_content_length_body_split_across_packets(server):
    c = Conn(server.port)
    expect_body(server, roundtrip(c, post_head(len(BODY)), BODY[:100], BODY[100:2000], BODY[2000:]))
    c.close()


def test_chunked_body_split_across_packets(server):
    """What the JDK client sends for a streamed body publisher, and the raw-socket case of the matrix."""
    c = Conn(server.port)
    expect_body(server, roundtrip(c, post_head(None), *chunked(BODY, 1000)))
    c.close()


def test_keep_alive_reuse_after_the_offer(server):
    """Three requests on one connection, as the JDK client pools it: offer + body, offer + chunked
    body, a plain request. As published the dropped body bytes are parsed as the next request."""
    c = Conn(server.port)
    second = b'{"second": true}'
    answers = [roundtrip(c, post_head(len(BODY)) + BODY), roundtrip(c, post_head(None), *chunked(second, 5)),
               roundtrip(c, post_head(len(second), offer=False) + second)]  # fmt: skip
    c.close()
    if server.patched:
        expect_body(server, answers[0])
        expect_body(server, answers[1], second)
        expect_body(server, answers[2], second)
    else:
        assert [json.loads(b)["len"] if s == 200 else s for s, b in answers] != [len(BODY), len(second), len(second)]


def test_pipelined_requests_after_the_offer(server):
    """Two offering requests in one write: each body goes to its own request."""
    if not server.patched:
        pytest.skip("as published the first body is dropped (the cases above show it)")
    c = Conn(server.port)
    second = b'{"second": 2}'
    expect_body(server, roundtrip(c, post_head(len(BODY)) + BODY + post_head(len(second)) + second))
    expect_body(server, c.response()[::2], second)
    c.close()


def test_truncated_body_is_a_400(server):
    """The client ends its side after half the announced body: 400, not a short body."""
    c = Conn(server.port)
    c.send(post_head(len(BODY)) + BODY[: len(BODY) // 2])
    time.sleep(0.1)
    c.s.shutdown(socket.SHUT_WR)
    status, _, got = c.response()
    if server.patched:
        assert status == 400 and b"request body was complete" in got
    else:
        assert status == 200 and json.loads(got)["len"] == 0  # silently short: the app read nothing
    c.close()


def test_truncated_body_without_offer_is_a_400(server):
    c = Conn(server.port)
    c.send(post_head(len(BODY), offer=False) + BODY[:10])
    time.sleep(0.1)
    c.s.shutdown(socket.SHUT_WR)
    if server.patched:
        assert c.response()[0] == 400
    else:
        with pytest.raises(ConnectionError):  # as published: closed without an answer
            c.response()
    c.close()


def test_websocket_upgrade_still_works(server):
    c = Conn(server.port)
    key = base64.b64encode(b"0123456789abcdef")
    c.send(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n\r\n")  # fmt: skip
    status, headers, _ = c.response()
    assert status == 101
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
    assert headers["sec-websocket-accept"] == accept
    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"hi"))
    c.send(b"\x81\x82" + mask + payload)
    while len(c.buf) < 2 + len("echo hi"):
        c.buf += c.s.recv(1024)
    assert c.buf[2 : 2 + len("echo hi")] == b"echo hi"
    c.close()


def test_plain_requests_unchanged(server):
    c = Conn(server.port)
    for _ in range(2):
        status, got = roundtrip(c, post_head(len(BODY), offer=False) + BODY)
        assert status == 200 and json.loads(got)["len"] == len(BODY)
    c.close()


def test_every_uvicorn_server_of_the_stack_gets_the_patched_protocol():
    """Trinity's proxy (serve_http: uvicorn.Config(app, host, port), no `http=` setting) and vLLM's
    OpenAI server (vllm/entrypoints/launcher.py: uvicorn.Config(app, **uvicorn_kwargs), no `http`
    among vLLM's uvicorn options) both run uvicorn's default "auto" protocol, which is httptools when
    it is installed: the installed module, which `rftstack relax` patches."""
    import inspect

    from trinity.explorer.proxy import app as proxy_app
    from uvicorn.protocols.http.auto import AutoHTTPProtocol
    from vllm.entrypoints import launcher

    proxy_source = inspect.getsource(proxy_app.serve_http)  # the api-key patch adds **tls: ssl_* files only
    assert "uvicorn.Config(app, host=host, port=port" in proxy_source and "http=" not in proxy_source
    assert "uvicorn.Config(app, **uvicorn_kwargs)" in inspect.getsource(launcher.serve_http)
    config = uvicorn.Config(echo)
    config.load()
    assert config.http_protocol_class is AutoHTTPProtocol and AutoHTTPProtocol.__name__ == "HttpToolsProtocol"
    assert uvicorn_helpers.MARK in Path(inspect.getsourcefile(AutoHTTPProtocol)).read_text(), "run `rftstack relax`"
