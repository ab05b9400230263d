"""A TEST DOUBLE of vLLM 0.23.0's OpenAI chat endpoint (vLLM itself needs a GPU), faithful on the
wire where Trinity's proxy reads it.

What is real: the HTTP server stack vLLM uses (FastAPI + uvicorn, `StreamingResponse` with
``text/event-stream``, chunked transfer encoding) and vLLM's own protocol classes
(`ChatCompletionStreamResponse`, `ChatCompletionResponseStreamChoice`, `DeltaMessage`,
`ChatCompletionLogProbs`, `UsageInfo`, serialized with ``model_dump_json(exclude_unset=True)`` as
`OpenAIServingChat.chat_completion_stream_generator` does), and vLLM's own media-type check of the
chat route (`validate_json_request`) with its `validation_exception_handler`. What stands in: the engine, so the
tokens and logprobs are a deterministic function of the request (`planned`).

The stream, as vLLM emits it for ``return_token_ids: true, logprobs: true`` (top_logprobs 0):
  1. per choice, a role chunk: ``delta {role: assistant, content: ""}``, ``logprobs: null``,
     ``finish_reason: null``, and ``prompt_token_ids`` on the chunk (the only chunk that has them);
  2. one chunk per generated token: ``delta {content}``, ``logprobs.content`` with one entry,
     ``token_ids`` with one id; the last one carries ``finish_reason`` and ``stop_reason``;
  3. with ``stream_options.include_usage``: a usage chunk with ``choices: []``;
  4. ``data: [DONE]``.
Every event is framed ``data: <json>\\n\\n``. With ``split_bytes=k`` each event is sent as pieces of
at most k bytes (separate HTTP chunks), so a reader's ``aiter_raw()`` sees arbitrary splits.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL_ID = "test-double-vllm"


def numeric_asked(body: dict) -> bool:
    """A non-streamed request that the patched vLLM answers with numeric logprobs (vllm_xargs'
    rftstack_logprobs_numeric, no top_logprobs, no prompt logprobs)."""
    xargs = body.get("vllm_xargs")
    return (isinstance(xargs, dict) and bool(xargs.get("rftstack_logprobs_numeric")) and not body.get("stream")
            and not body.get("top_logprobs") and body.get("prompt_logprobs") is None)


def planned(body: dict) -> dict:
    """The double's deterministic 'generation' for a request body: prompt ids, output ids, logprobs."""
    text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
    prompt = [151644] + [32 + (b % 90) for b in text.encode()][:64] + [151645]
    n = int(body.get("max_tokens") or 8)
    out = [1000 + (len(text) * 7 + i * 13) % 5000 for i in range(n)]
    logprobs = [round(-0.01 * (i + 1) - 0.001 * (len(text) % 10), 6) for i in range(n)]
    return {"prompt_token_ids": prompt, "token_ids": out, "logprobs": logprobs, "finish_reason": "length"}


def _events(body: dict, request_id: str) -> list[str]:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProbs,
        ChatCompletionLogProbsContent,
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )
    from vllm.entrypoints.openai.engine.protocol import DeltaMessage, UsageInfo

    p = planned(body)
    created = int(time.time())
    want_ids = bool(body.get("return_token_ids"))
    want_lp = bool(body.get("logprobs")) and body.get("top_logprobs", 0) is not None
    n = 1 if body.get("n") is None else int(body["n"])
    events = []
    for i in range(n):  # first iteration: the role chunk, prompt_token_ids on it
        chunk = ChatCompletionStreamResponse(
            id=request_id, object="chat.completion.chunk", created=created, model=MODEL_ID,
            choices=[ChatCompletionResponseStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""),
                                                        logprobs=None, finish_reason=None)],
            prompt_token_ids=p["prompt_token_ids"] if want_ids else None,
        )
        events.append(chunk.model_dump_json(exclude_unset=True))
    last = len(p["token_ids"]) - 1
    for k, (tok, lp) in enumerate(zip(p["token_ids"], p["logprobs"])):
        for i in range(n):
            logprobs = (ChatCompletionLogProbs(content=[ChatCompletionLogProbsContent(
                token=f"t{tok}", logprob=lp, bytes=list(f"t{tok}".encode()))]) if want_lp else None)
            kw = dict(finish_reason=p["finish_reason"], stop_reason=None) if k == last else dict(finish_reason=None)
            choice = ChatCompletionResponseStreamChoice(index=i, delta=DeltaMessage(content=f"t{tok} "), logprobs=logprobs,
                                                        token_ids=[tok] if want_ids else None, **kw)
            chunk = ChatCompletionStreamResponse(id=request_id, object="chat.completion.chunk", created=created,
                                                 choices=[choice], model=MODEL_ID)
            events.append(chunk.model_dump_json(exclude_unset=True))
    if (body.get("stream_options") or {}).get("include_usage"):
        np_, nc = len(p["prompt_token_ids"]), n * len(p["token_ids"])
        usage = ChatCompletionStreamResponse(id=request_id, object="chat.completion.chunk", created=created, choices=[],
                                             model=MODEL_ID, usage=UsageInfo(prompt_tokens=np_, completion_tokens=nc,
                                                                             total_tokens=np_ + nc), system_fingerprint=None)
        events.append(usage.model_dump_json(exclude_unset=True, exclude_none=True))
    return [f"data: {e}\n\n" for e in events] + ["data: [DONE]\n\n"]


class VLLMStreamDouble:
    """``with VLLMStreamDouble() as d: d.base_url``; ``d.sent[request_id]`` is what was planned for it."""

    def __init__(self, *, split_bytes: int = 0, token_delay_s: float = 0.0):
        self.split_bytes = split_bytes
        self.token_delay_s = token_delay_s
        self.sent: dict[str, dict] = {}
        self.bodies: list[dict] = []
        self.headers: list[dict] = []  # the request headers of each chat completion, as received
        app = FastAPI()
        double = self
        # vLLM 0.23's own request checks and their error answers: only application/json is accepted
        # (validate_json_request), refusals come from its validation_exception_handler
        from types import SimpleNamespace

        from fastapi import Depends
        from fastapi.exceptions import RequestValidationError
        from vllm.entrypoints.serve.utils.api_utils import validate_json_request
        from vllm.entrypoints.serve.utils.server_utils import validation_exception_handler

        app.state.args = SimpleNamespace(log_error_stack=False)
        app.exception_handler(RequestValidationError)(validation_exception_handler)

        @app.get("/v1/models")
        async def models():
            return JSONResponse({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

        @app.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
        async def chat(request: Request):
            double.headers.append(dict(request.headers))
            body = await request.json()
            double.bodies.append(body)
            request_id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
            double.sent[request_id] = planned(body)
            if not body.get("stream"):
                return JSONResponse(double._full(body, request_id))

            async def gen():
                for ev in _events(body, request_id):
                    if double.token_delay_s:
                        await asyncio.sleep(double.token_delay_s)
                    if double.split_bytes:
                        raw = ev.encode()
                        for j in range(0, len(raw), double.split_bytes):
                            yield raw[j:j + double.split_bytes]
                    else:
                        yield ev

            return StreamingResponse(content=gen(), media_type="text/event-stream")

        self.app = app
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = None
        self._thread = None

    @staticmethod
    def _full(body: dict, request_id: str) -> dict:
        p = planned(body)
        choice = {"index": 0, "message": {"role": "assistant", "content": " ".join(f"t{t}" for t in p["token_ids"])},
                  "finish_reason": p["finish_reason"], "stop_reason": None}
        if body.get("return_token_ids"):
            choice["token_ids"] = p["token_ids"]
        if body.get("logprobs") and numeric_asked(body):  # as patches/vllm-logprobs-numeric.patch answers
            choice["logprobs"], choice["rftstack_logprobs"] = None, list(p["logprobs"])
        elif body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"t{t}", "logprob": lp, "bytes": list(f"t{t}".encode()), "top_logprobs": []}
                                              for t, lp in zip(p["token_ids"], p["logprobs"])]}
        out = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": MODEL_ID, "choices": [choice],
               "usage": {"prompt_tokens": len(p["prompt_token_ids"]), "completion_tokens": len(p["token_ids"]),
                         "total_tokens": len(p["prompt_token_ids"]) + len(p["token_ids"])}}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = p["prompt_token_ids"]
        return out

    def __enter__(self) -> "VLLMStreamDouble":
        import uvicorn

        _events({"messages": [], "max_tokens": 1}, "warm")  # import vLLM's protocol classes before serving
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True)
        self._thread.start()
        end = time.monotonic() + 60
        while not self._server.started:
            if time.monotonic() > end or not self._thread.is_alive():
                raise RuntimeError("the vLLM stream double did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
