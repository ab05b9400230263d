"""Clients of Trinity's endpoint for the client matrix: each does two chat completions, one streamed
chat completion, POST /feedback with the ids it got back and POST /commit, and returns what it saw
as ``Outcome`` (requests ok/failed, msg ids, failure texts). Plus a runner of Trinity's REAL proxy
app (tests/doubles/trinity_proxy_host.py) in front of an upstream, with a chosen directory first on
its sys.path (a copy of uvicorn as published, to show what the stack did without the patch)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import proxy_helpers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OFFER = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n"


@dataclasses.dataclass
class Outcome:
    ok: int = 0
    failed: int = 0
    msg_ids: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    def fail(self, what: str) -> None:
        self.failed += 1
        self.failures.append(what)

    @classmethod
    def from_json_line(cls, text: str) -> "Outcome":
        d = json.loads(text.strip().splitlines()[-1])
        return cls(d["requests_ok"], d["requests_failed"], d["msg_ids"], d["failures"])


class Proxy(proxy_helpers.Proxy):
    """Trinity's proxy app in a child process (proxy_helpers.Proxy without the write trace), read as
    the matrix reads it: each stored response's reward, and what /commit delivered."""

    def __init__(self, upstream: str, work: Path, first_on_path: Path | None = None):
        super().__init__(upstream, work, first_on_path, trace=False)

    def rewards(self) -> dict[str, float | None]:
        """msg_id -> reward of every row of proxy_history."""
        if not self.db.exists():
            return {}
        con = sqlite3.connect(self.db)
        try:
            return dict(con.execute("select msg_id, reward from proxy_history"))
        finally:
            con.close()


def chat_body(model: str, content: str, stream: bool = False) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 5, "stream": stream}


def sse_ids(text: str) -> tuple[set[str], bool]:
    """The chunk ids of a server-sent-events body, and whether it ended with [DONE]."""
    events = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    ids = {json.loads(e).get("id") for e in events if e != "[DONE]"}
    return ids, bool(events) and events[-1] == "[DONE]"


def agent_steps(model: str, reward: float, tag: str):
    """The four kinds of request every client sends, as (kind, path, body)."""
    for i in range(2):
        yield "chat", "/v1/chat/completions", chat_body(model, f"{tag} {i}")
    yield "stream", "/v1/chat/completions", chat_body(model, f"{tag} streams", stream=True)
    yield "feedback", "/feedback", None  # the body needs the ids collected so far
    yield "commit", "/commit", {}


def run_steps(model: str, reward: float, tag: str, send) -> Outcome:
    """Drive ``send(kind, path, body) -> (status, text)`` through agent_steps."""
    out = Outcome()
    for kind, path, body in agent_steps(model, reward, tag):
        if kind == "feedback":
            body = {"msg_ids": list(out.msg_ids), "reward": reward, "task_id": tag, "run_id": 0}
        try:
            status, text = send(kind, path, body)
        except Exception as exc:  # noqa: BLE001 - any client error is this client's failure
            out.fail(f"{kind}: {type(exc).__name__}: {exc}")
            continue
        if status != 200:
            out.fail(f"{kind}: HTTP {status}: {text[:300]}")
        elif kind == "chat":
            out.ok += 1
            out.msg_ids.append(json.loads(text)["id"])
        elif kind == "stream":
            ids, done = sse_ids(text)
            if len(ids) == 1 and done:
                out.ok += 1
                out.msg_ids.append(ids.pop())
            else:
                out.fail(f"stream: ids {ids}, [DONE] {done}: {text[-300:]}")
        else:
            out.ok += 1
    return out


# ---- the clients ---------------------------------------------------------------------------------


def openai_sdk(base: str, model: str, reward: float) -> Outcome:
    """The `openai` SDK: chat and streamed chat through its API, /feedback and /commit through its
    own HTTP client (client.post), as an agent built on the SDK would."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    root = client.with_options(base_url=base)

    def send(kind, path, body):
        if kind == "chat":
            r = client.chat.completions.create(**body)
            return 200, r.model_dump_json()
        if kind == "stream":
            chunks = list(client.chat.completions.create(**body))
            return 200, "".join(f"data: {c.model_dump_json()}\n\n" for c in chunks) + "data: [DONE]\n\n"
        r = root.post(path, body=body, cast_to=httpx.Response)
        return r.status_code, r.text

    return run_steps(model, reward, "openai", send)


def httpx_client(base: str, model: str, reward: float) -> Outcome:
    import httpx

    with httpx.Client(base_url=base, timeout=60) as c:
        return run_steps(model, reward, "httpx", lambda kind, path, body: (lambda r: (r.status_code, r.text))(c.post(path, json=body)))


def requests_client(base: str, model: str, reward: float) -> Outcome:
    import requests

    with requests.Session() as s:
        return run_steps(model, reward, "requests", lambda kind, path, body: (lambda r: (r.status_code, r.text))(s.post(base + path, json=body, timeout=60)))


def curl(base: str, model: str, reward: float, *, http2: bool, content_type: bool = True) -> Outcome:
    """curl: ``http2`` adds --http2 (on http:// it offers h2c with every request, as the JDK does)."""

    def send(kind, path, body):
        cmd = ["curl", "-sS", "-N", "-w", "\n%{http_code}", "-d", json.dumps(body), base + path]
        cmd += ["--http2"] if http2 else []
        cmd += ["-H", "Content-Type: application/json"] if content_type else []
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip())
        text, _, code = r.stdout.rpartition("\n")
        return int(code), text

    return run_steps(model, reward, "curl-http2" if http2 else "curl", send)


def node_fetch(base: str, reward: float, *, content_type: bool = True) -> Outcome:
    cmd = ["node", str(HERE / "clients" / "agent.mjs"), base, str(reward)] + ([] if content_type else ["--no-content-type"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return Outcome.from_json_line(r.stdout) if r.stdout.strip() else Outcome(failed=1, failures=[r.stderr[-2000:]])


def compile_java_agent(dest: Path) -> Path:
    """examples/java/Agent.java compiled with `javac --release 17` into ``dest``."""
    src = REPO / "examples" / "java" / "Agent.java"
    r = subprocess.run([shutil.which("javac") or "javac", "--release", "17", "-d", str(dest), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dest


def java_agent(classes: Path, base: str, *, http1: bool, agents: int = 1, chats: int = 2, java: str = "java") -> tuple[Outcome, int]:
    """The example Java agent (JDK HttpClient, defaults unless ``http1``); (outcome, exit code)."""
    cmd = [java, "-cp", str(classes), "Agent", base, "--agents", str(agents), "--chats", str(chats)] + (["--http1"] if http1 else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not r.stdout.strip():
        return Outcome(failed=1, failures=[r.stderr[-2000:]]), r.returncode
    return Outcome.from_json_line(r.stdout), r.returncode


class RawConn:
    """A raw HTTP/1.1 connection that sends every request with the h2c offer and a chunked body,
    each chunk in its own write; reads Content-Length and chunked responses."""

    def __init__(self, base: str):
        host, port = base.removeprefix("http://").split(":")
        self.addr = (host, int(port))
        self.s: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> None:
        """(Re)connect when the server closed the last connection, as a client's pool would."""
        if self.s is None:
            self.s = socket.create_connection(self.addr, timeout=60)
            self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""

    def close(self) -> None:
        if self.s is not None:
            self.s.close()
            self.s = None

    def _fill(self) -> None:
        chunk = self.s.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(self, path: str, body: dict) -> tuple[int, str]:
        """One exchange; the server's answer even when it closed the connection while the body was
        still being sent (then the connection is closed here too)."""
        self._connect()
        data = json.dumps(body).encode()
        try:
            self.s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + OFFER
                           + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            for i in range(0, len(data), 40):
                time.sleep(0.005)
                part = data[i : i + 40]
                self.s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            self.s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # read what the server said before it closed
        try:
            return self._response()
        finally:
            if self.buf or self._peer_closed():
                self.close()  # unread answers (to the body parsed as a request) or closed by the server

    def _peer_closed(self) -> bool:
        try:
            return self.s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _response(self) -> tuple[int, str]:
        status = int(self._line().split()[1])
        headers = {}
        while line := self._line():
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") == "chunked":
            body_out = b""
            while size := int(self._line().split(b";")[0], 16):
                body_out += self._take(size)
                self._take(2)
            self._line()
        else:
            body_out = self._take(int(headers.get("content-length", 0)))
        return status, body_out.decode()


def raw_h2c(base: str, model: str, reward: float) -> Outcome:
    conn = RawConn(base)
    try:
        return run_steps(model, reward, "raw-h2c", lambda kind, path, body: conn.request(path, body))
    finally:
        conn.close()
