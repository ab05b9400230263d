"""Bad requests and headers through Trinity's real proxy app (trinity/explorer/proxy/app.py),
in-process, with patches/trinity-proxy-request-hygiene.patch (the installed app after `rftstack
relax`) and without it (the same file with that patch reversed), so both answers are on record.

Real: the FastAPI app, ExplorerService.record_experience (Trinity's code) on its SQLite recorder.
TEST DOUBLE: the upstream vLLM server (an in-process FastAPI app) built from vLLM 0.23's own parts:
its `ChatCompletionRequest` body model, its `validate_json_request` media-type check and its
`validation_exception_handler` (whose 400 carries FastAPI's `File "...", line N, in ...` context,
the "traceback" the GPU run saw), a model-name check worded as vLLM's 404; it records the headers
it received.
"""


import asyncio
import importlib.util
import json
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rftstack.stack import patches, policy

httpx = pytest.importorskip("httpx")
from fastapi import Depends, FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

PATCH = "trinity-proxy-request-hygiene.patch"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def upstream_double(seen: list) -> FastAPI:
    """TEST DOUBLE of vLLM's chat route, with vLLM's own request model, media-type check and 400 handler."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import validate_json_request
    from vllm.entrypoints.serve.utils.server_utils import validation_exception_handler

    up = FastAPI()
    up.state.args = SimpleNamespace(log_error_stack=False)
    up.exception_handler(RequestValidationError)(validation_exception_handler)

    @up.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
    async def chat(body: ChatCompletionRequest, raw: Request):
        seen.append(dict(raw.headers))
        if body.model != "m":
            return JSONResponse(status_code=404, content={"error": {"message": f"The model `{body.model}` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}})
        return JSONResponse(
            {"id": f"chatcmpl-{len(seen)}", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2, 3],
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": [4, 5],
                          "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}, "finish_reason": "stop"}]},
            headers={"server": "vllm-double", "date": "Mon, 01 Jan 2024 00:00:00 GMT", "x-request-id": "r1"})  # fmt: skip

    return up


def load_app(patched: bool, tmp: Path):
    """The installed app.py (all policy patches), or the same with this patch reversed, as a private module."""
    import trinity

    (p,) = [p for p in policy.load().patches if p.file == PATCH]
    (fp,) = patches.parse((patches.patches_dir() / p.file).read_text())
    text = (Path(trinity.__file__).parents[1] / fp.path).read_text()
    if "_read_json_object" not in text:
        pytest.fail("the installed Trinity lacks trinity-proxy-request-hygiene.patch: run `rftstack relax`")
    if not patched:
        text = patches.undo(text, patches.patches_dir() / p.file, fp.path)
    name = f"proxy_app_{'hygiene' if patched else 'before_hygiene'}"
    path = tmp / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Service:
    def __init__(self, db: Path, upstream: str):
        from trinity.explorer.proxy.recorder import HistoryRecorder
        from trinity.explorer.proxy.service import ExplorerService

        self.upstream = upstream
        self.recorder = HistoryRecorder(db_url=f"sqlite:///{db}", table_name="proxy_history")
        self.total_experience_count = 0
        self.record_experience = ExplorerService.record_experience.__get__(self)

    async def allocate_model(self, increase_count: bool = True):
        return self.upstream, 0


def big_chunks(n: int):
    async def gen():
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        yield b"x" * n
        yield b'"}]}'

    return gen()


# (name, request kwargs for httpx's client.post, upstream URL)
REQUESTS = [
    ("malformed", {"content": b'{"model": "m", "messages": [', "headers": {"content-type": "application/json"}}),
    ("array", {"content": b"[1, 2]", "headers": {"content-type": "application/json"}}),
    ("empty-h2c", {"content": b"", "headers": {"content-type": "application/json", "upgrade": "h2c", "connection": "Upgrade, HTTP2-Settings"}}),
    ("too-big", {"json": {**CHAT, "messages": [{"role": "user", "content": "x" * 3000}]}}),
    ("too-big-chunked", {"content": big_chunks(3000), "headers": {"content-type": "application/json"}}),
    ("unknown-model", {"json": {**CHAT, "model": "nope"}}),
    ("unknown-model-stream", {"json": {**CHAT, "model": "nope", "stream": True}}),
    ("no-messages", {"json": {"model": "m"}}),
    ("text-plain", {"content": json.dumps(CHAT).encode(), "headers": {"content-type": "text/plain;charset=UTF-8"}}),
    ("form-label", {"content": json.dumps(CHAT).encode(), "headers": {"content-type": "application/x-www-form-urlencoded"}}),
    ("headers", {"json": CHAT, "headers": {"authorization": "Bearer secret", "cookie": "session=1", "connection": "Upgrade, HTTP2-Settings, X-Hop",
                                            "upgrade": "h2c", "http2-settings": "AAMAAABkAAQCAAAAAAIAAAAA", "keep-alive": "timeout=5",
                                            "te": "trailers", "trailer": "x-t", "proxy-authorization": "Basic x", "x-hop": "1", "x-agent": "kept"}}),
    ("unreachable", {"json": CHAT}),
]


async def exchange(app_mod, service_for, seen):
    app = app_mod.app
    app.state.temperature, app.state.inference_timeout, app.state.models_cache = 1.0, 30, None
    up = upstream_double(seen)
    app.state.http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=up))
    out = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://proxy") as c:
        for name, kw in REQUESTS:
            app.state.service = service_for("http://127.0.0.1:9" if name == "unreachable" else "http://upstream")
            if name == "unreachable":  # a real connection refused (port 9 on loopback: nothing listens)
                app.state.http_client = httpx.AsyncClient()
            r = await c.post("/v1/chat/completions", **kw)
            out[name] = (r.status_code, r.headers, r.text, len(seen))
    return out


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("RFTSTACK_PROXY_MAX_BODY_BYTES", "2000")
    out = {}
    try:
        for patched in (True, False):
            tmp = tmp_path_factory.mktemp("hygiene" if patched else "before")
            db = tmp / "proxy_history.db"
            services = {}
            seen: list = []
            got = asyncio.run(exchange(load_app(patched, tmp), lambda url: services.setdefault(url, Service(db, url)), seen))
            rows = sqlite3.connect(db).execute("select count(*) from proxy_history").fetchone()[0] if db.exists() else 0
            out[patched] = SimpleNamespace(got=got, seen=seen, rows=rows)
    finally:
        mp.undo()
    return out


def error(answer) -> tuple[int, str]:
    """(status, message) of an OpenAI-shaped error answer; fails on any other shape."""
    status, _, text, _ = answer
    body = json.loads(text)
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str), text
    return status, body["error"]["message"]


def test_bad_bodies_are_one_openai_error(answers):
    got = answers[True].got
    assert error(got["malformed"])[0] == 400 and error(got["malformed"])[1].startswith("the request body is not valid JSON (Expecting value")
    assert error(got["array"]) == (400, "the request body is JSON but not an object (it is a list); send the chat completion request as a JSON object")
    status, msg = error(got["empty-h2c"])
    assert status == 400 and msg.startswith("the request body is empty") and "uvicorn-httptools-ignore-upgrade.patch" in msg
    for name in ("too-big", "too-big-chunked"):
        status, msg = error(got[name])
        assert status == 413 and "larger than this proxy's limit of 2000 bytes" in msg
    # as published: FastAPI's {"detail": "Invalid JSON: ..."}, a 500 for an array, no size limit
    before = answers[False].got
    assert json.loads(before["malformed"][2]) == {"detail": "Invalid JSON: Expecting value: line 1 column 29 (char 28)"}
    assert before["array"][0] == 500
    assert before["too-big"][0] == 200


def test_engine_errors_pass_without_traceback(answers):
    got = answers[True].got
    assert error(got["unknown-model"]) == (404, "The model `nope` does not exist.")
    assert error(got["unknown-model-stream"]) == (404, "The model `nope` does not exist.")  # one JSON answer, not a stream
    assert got["unknown-model-stream"][1]["content-type"] == "application/json"
    status, msg = error(got["no-messages"])
    assert status == 400 and "Field required" in msg and 'File "' not in msg and "Traceback" not in msg
    status, msg = error(got["unreachable"])
    assert status == 502 and msg.startswith("Failed to connect upstream model at http://127.0.0.1:9: ConnectError") and "Traceback" not in msg
    before = answers[False].got
    assert 'File "' in json.loads(before["no-messages"][2])["error"]["message"]  # vLLM's answer as it was passed on
    assert "Traceback (most recent call last)" in json.loads(before["unreachable"][2])["error"]["message"]


def test_any_json_body_is_sent_to_the_engine_as_json(answers):
    """curl -d (form-urlencoded label) and fetch without headers (text/plain) are served; as
    published the label went to vLLM, which refuses it ("Unsupported Media Type")."""
    for name in ("text-plain", "form-label"):
        status, _, text, _ = answers[True].got[name]
        assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "hi"
        status, _, text, _ = answers[False].got[name]
        assert status == 400 and "Unsupported Media Type" in text


def test_headers_passed_on(answers):
    res = answers[True]
    n = res.got["headers"][3]
    sent = res.seen[n - 1]  # what the engine received for the "headers" request
    for h in ("authorization", "cookie", "upgrade", "http2-settings", "keep-alive", "te", "trailer", "proxy-authorization", "x-hop"):
        assert h not in sent, (h, sent)
    assert sent["content-type"] == "application/json" and sent["x-agent"] == "kept"
    back = res.got["headers"][1]
    assert "server" not in back and "date" not in back and back["x-request-id"] == "r1"  # uvicorn adds its own date/server
    before = answers[False]
    sent_before = before.seen[before.got["headers"][3] - 1]
    assert sent_before["authorization"] == "Bearer secret" and "http2-settings" in sent_before
    assert before.got["headers"][1]["server"] == "vllm-double"


def test_nothing_recorded_for_refused_requests(answers):
    res = answers[True]
    ok = [n for n, a in res.got.items() if a[0] == 200]
    assert sorted(ok) == ["form-label", "headers", "text-plain"]
    assert res.rows == len(ok)


def test_the_default_body_limit_is_32_mib(tmp_path):
    assert load_app(True, tmp_path).MAX_BODY_BYTES == 32 * 1024 * 1024
