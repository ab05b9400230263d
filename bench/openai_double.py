"""A TEST DOUBLE of an OpenAI-compatible server (stands in for vLLM, which needs a GPU).

Real HTTP on loopback (stdlib ThreadingHTTPServer on a free port), with deterministic behaviour the
load generator's tests check against: request number k (1-based, counted across the server's
life) fails with HTTP 500 when ``k % fail_every == 0``, otherwise answers with
``usage.completion_tokens = max_tokens`` (or one less when ``k % short_every == 0``), after
``delay_s`` plus ``delay_per_token_s`` for each of its completion tokens (so that answers of spread lengths
come back at spread times, as a GPU's do). Every request body is kept in ``bodies`` (unless ``keep_bodies=False``).

Like vLLM, it returns ``prompt_token_ids`` and per-choice ``token_ids`` when the request asks for
``return_token_ids``, and per-token ``logprobs.content`` when it asks for ``logprobs`` (with
``vllm_xargs.rftstack_logprobs_numeric``, as vLLM with patches/vllm-logprobs-numeric.patch: the numbers as
``rftstack_logprobs``, ``logprobs`` null): the fields Trinity's proxy records. Used by the tests and by bench/proxy_overhead.py (never for GPU numbers).

    python bench/openai_double.py [--delay-s 0.0] [--delay-per-token-s 0.0]    # prints "URL http://127.0.0.1:PORT", serves until killed
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_ID = "test-double-model"


class OpenAIDouble:
    def __init__(self, *, fail_every: int = 0, short_every: int = 0, delay_s: float = 0.0, keep_bodies: bool = True,
                 delay_per_token_s: float = 0.0):
        self.keep_bodies = keep_bodies
        self.delay_per_token_s = delay_per_token_s
        self.fail_every = fail_every
        self.short_every = short_every
        self.delay_s = delay_s
        self.bodies: list[dict] = []
        self.count = 0
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                with double._lock:
                    double.count += 1
                    k = double.count
                    if double.keep_bodies:
                        double.bodies.append(body)
                n = int(body.get("max_tokens", 16))
                if double.short_every and k % double.short_every == 0:
                    n -= 1
                delay = double.delay_s + double.delay_per_token_s * n
                if delay:
                    time.sleep(delay)
                if double.fail_every and k % double.fail_every == 0:
                    self._send(500, {"error": {"message": f"test double: planned failure of request {k}"}})
                    return
                choice = {"index": 0, "message": {"role": "assistant", "content": "x" * n}, "finish_reason": "length"}
                reply = {
                    "id": f"chatcmpl-double-{k}", "object": "chat.completion", "model": MODEL_ID, "choices": [choice],
                    "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n},
                }
                if body.get("return_token_ids"):
                    reply["prompt_token_ids"] = list(range(10))
                    choice["token_ids"] = [100 + i for i in range(n)]
                xargs = body.get("vllm_xargs")
                if body.get("logprobs") and isinstance(xargs, dict) and xargs.get("rftstack_logprobs_numeric") \
                        and not body.get("top_logprobs"):  # as patches/vllm-logprobs-numeric.patch answers
                    choice["logprobs"], choice["rftstack_logprobs"] = None, [-0.5] * n
                elif body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}] * n}
                self._send(200, reply)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default 5 drops connections at concurrency 32+

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OpenAIDouble":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="a TEST DOUBLE OpenAI server on a free loopback port")
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--delay-per-token-s", type=float, default=0.0, help="more delay per completion token")
    ap.add_argument("--name", default="", help="a word for the command line only, so that a profiler or a test can "
                    "tell this double from others running on the machine")
    a = ap.parse_args()
    if a.delay_s < 0 or a.delay_per_token_s < 0:
        ap.error("--delay-s and --delay-per-token-s take seconds, 0 or more")
    with OpenAIDouble(delay_s=a.delay_s, delay_per_token_s=a.delay_per_token_s, keep_bodies=False) as d:
        print("URL", d.base_url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
