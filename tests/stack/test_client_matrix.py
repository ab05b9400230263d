"""Every kind of client an agent is written with, against Trinity's REAL proxy app
(tests/doubles/trinity_proxy_host.py: Trinity's app.py, its SQLite recorder, ExplorerService's own
record/feedback/commit code) in front of tests/doubles/vllm_stream_double.py (a TEST DOUBLE of
vLLM 0.23's chat endpoint; vLLM needs a GPU). Each client runs two chat completions, one streamed
chat completion, POST /feedback with the ids it got back, POST /commit; the test then checks that
every id is a row of proxy_history with the client's reward and a line of the commits file.

Guards an upstream behaviour (uvicorn #2722, httptools #124): uvicorn 0.54.0's httptools protocol
as published drops the body of any request that offers `Upgrade: h2c`. The JDK's default
HttpClient and a raw client offering h2c with a chunked body are also run against the same proxy
with uvicorn as published (a copy first on its sys.path), where every chat completion fails
(400 "Invalid JSON", the report's symptom) and nothing reaches the store; the installed, patched
uvicorn (patches/uvicorn-httptools-ignore-upgrade.patch, applied by `rftstack relax`) serves them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import client_helpers as ch
import uvicorn_helpers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from vllm_stream_double import MODEL_ID, VLLMStreamDouble  # noqa: E402

NEEDS = {"java-default": "javac", "java-http1": "javac", "curl-http2": "curl", "curl": "curl", "node-fetch": "node"}
CLIENTS = ["java-default", "java-http1", "curl-http2", "curl", "openai", "httpx", "requests", "node-fetch", "raw-h2c"]
REWARD = {name: round(0.1 * (i + 1), 1) for i, name in enumerate(CLIENTS)}
REWARD["java-default"] = REWARD["java-http1"] = 1.0  # the example agent's reward


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed here (CI has it); this client case needs it")


@pytest.fixture(scope="module")
def double():
    with VLLMStreamDouble() as d:
        yield d


@pytest.fixture(scope="module")
def proxy(double, tmp_path_factory):
    px = ch.Proxy(double.base_url, tmp_path_factory.mktemp("proxy"))
    yield px
    px.stop()


@pytest.fixture(scope="module")
def published_proxy(double, tmp_path_factory):
    """The same proxy, with uvicorn's httptools protocol as published first on its sys.path."""
    site = uvicorn_helpers.uvicorn_site(tmp_path_factory.mktemp("uvicorn-published"), patched=False)
    px = ch.Proxy(double.base_url, tmp_path_factory.mktemp("published"), site)
    yield px
    px.stop()


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory):
    need("javac")
    return ch.compile_java_agent(tmp_path_factory.mktemp("java"))


def run_client(name: str, base: str, classes_factory) -> ch.Outcome:
    if name in NEEDS:
        need(NEEDS[name])
    if name.startswith("java"):
        return ch.java_agent(classes_factory(), base, http1=name == "java-http1")[0]
    if name.startswith("curl"):
        return ch.curl(base, MODEL_ID, REWARD[name], http2=name == "curl-http2")
    if name == "node-fetch":
        return ch.node_fetch(base, REWARD[name])
    return {"openai": ch.openai_sdk, "httpx": ch.httpx_client, "requests": ch.requests_client, "raw-h2c": ch.raw_h2c}[name](base, MODEL_ID, REWARD[name])


@pytest.mark.parametrize("name", CLIENTS)
def test_client_lands_every_response_in_the_store(name, proxy, request):
    out = run_client(name, proxy.base, lambda: request.getfixturevalue("java_classes"))
    assert out.failed == 0 and out.ok == 5, out.failures
    assert len(out.msg_ids) == 3 and len(set(out.msg_ids)) == 3
    rows, committed = proxy.rewards(), proxy.commits_by_id()
    for mid in out.msg_ids:
        assert rows.get(mid) == REWARD[name], (mid, rows.get(mid))
        assert mid in committed and committed[mid]["reward"] == REWARD[name] and committed[mid]["token_ids"]


@pytest.mark.parametrize("name", ["java-default", "raw-h2c", "curl-http2"])
def test_h2c_offering_clients_fail_on_uvicorn_as_published(name, published_proxy, request):
    """Without the patch the body is dropped: every chat completion is a 400 (the report's symptom was
    Trinity's "Invalid JSON"; with trinity-proxy-request-hygiene.patch the proxy says the body is
    empty and names the uvicorn patch), nothing is recorded, and /commit still answers 200 having
    committed nothing.
    (The raw client's chunks, sent after the head, are then parsed as a next request: a second 400,
    "Invalid HTTP request received.", and the connection closed.)"""
    out = run_client(name, published_proxy.base, lambda: request.getfixturevalue("java_classes"))
    assert out.msg_ids == [] and out.failed >= 3
    chats = [f for f in out.failures if f.startswith(("chat", "stream"))]
    # each one fails, with the proxy's sentence naming the cause or, when the dropped body bytes
    # arrive apart from the head and are parsed as a next request, uvicorn's 400 "Invalid HTTP
    # request received." (which can reach the client first) or the connection it then closes
    assert len(chats) == 3, out.failures
    assert all("400" in f or "closed" in f.lower() or "IOException" in f or "Error" in f for f in chats), out.failures
    assert any("the request body is empty" in f and "uvicorn-httptools-ignore-upgrade.patch" in f for f in out.failures), out.failures
    assert not any(f.startswith("commit") for f in out.failures)  # /commit said 200 all the same
    assert published_proxy.rewards() == {} and published_proxy.commits_by_id() == {}
    assert "Unsupported upgrade request." in published_proxy.log.read_text()


def test_plain_http1_clients_work_on_uvicorn_as_published(published_proxy, request):
    """The control: the same published stack serves the JDK client forced to HTTP/1.1."""
    out = run_client("java-http1", published_proxy.base, lambda: request.getfixturevalue("java_classes"))
    assert out.failed == 0 and len(out.msg_ids) == 3


@pytest.mark.parametrize("name", ["curl", "node-fetch"])
def test_json_without_a_json_label(name, proxy, double):
    """`curl -d` without -H (labelled application/x-www-form-urlencoded) and Node's fetch without
    headers (text/plain): the proxy takes the JSON body and sends it to the engine as
    application/json (trinity-proxy-request-hygiene.patch); vLLM's own check refuses anything else."""
    need(NEEDS[name])
    before = len(double.headers)
    out = ch.curl(proxy.base, MODEL_ID, 0.7, http2=False, content_type=False) if name == "curl" else ch.node_fetch(proxy.base, 0.7, content_type=False)
    assert out.failed == 0 and len(out.msg_ids) == 3, out.failures
    assert {h["content-type"] for h in double.headers[before:]} == {"application/json"}
    assert all(proxy.rewards().get(m) == 0.7 for m in out.msg_ids)


def test_response_headers_once_and_nothing_hop_by_hop_forwarded(proxy, double):
    """Through uvicorn: one date and one server header (the engine's are not copied next to
    uvicorn's), and the engine gets no hop-by-hop or credential header."""
    conn = ch.RawConn(proxy.base)
    conn._connect()
    body = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "headers"}], "max_tokens": 2}).encode()
    conn.s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + ch.OFFER + b"Authorization: Bearer t\r\nCookie: a=1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.s.recv(65536)
    conn.close()
    names = [ln.split(b":", 1)[0].lower() for ln in head.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
    assert head.startswith(b"HTTP/1.1 200") and names.count(b"date") == 1 and names.count(b"server") == 1, head
    sent = double.headers[-1]
    assert not {"authorization", "cookie", "upgrade", "http2-settings"} & set(sent), sent


def test_docs_client_examples_are_the_files_and_work_as_is(proxy, double, tmp_path):
    """docs/serve.md's Java and Python examples are examples/java/Minimal.java and
    examples/python/minimal.py, verbatim; both run unchanged against the proxy and land their
    response in the store, rewarded and committed."""
    import re
    import subprocess

    docs = (ch.REPO / "docs" / "serve.md").read_text()
    for rel, lang in (("examples/java/Minimal.java", "java"), ("examples/python/minimal.py", "python")):
        m = re.search(rf"<!-- {re.escape(rel)} -->\n```{lang}\n(.*?)```", docs, re.S)
        assert m and m.group(1) == (ch.REPO / rel).read_text(), f"docs/serve.md does not show {rel} as it is"
    runs = [[sys.executable, str(ch.REPO / "examples/python/minimal.py"), proxy.base, MODEL_ID]]
    if shutil.which("javac"):
        subprocess.run(["javac", "--release", "17", "-d", str(tmp_path), str(ch.REPO / "examples/java/Minimal.java")], check=True, timeout=300)
        runs.append(["java", "-cp", str(tmp_path), "Minimal", proxy.base, MODEL_ID])
    for cmd in runs:
        before = set(proxy.commits_by_id())
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        new = set(proxy.commits_by_id()) - before
        assert len(new) == 1 and proxy.rewards()[new.pop()] == 1.0, r.stdout
