"""Child process of bench/anyio_root.py and tests/stack/test_engine_anyio_root.py: Trinity's engine API server as its
engine actor runs it, on a real Ray async actor's loop, with the installed (patched) Trinity's real
``run_server_worker_in_ray`` and vLLM's real ``serve_http`` (uvicorn) and ``load_aware_call``.

    python anyio_root_probe.py RAY_ADDRESS SWITCH REQUESTS CONCURRENCY

SWITCH is RFTSTACK_ENGINE_ANYIO_ROOT in the actor's environment ("-": unset). What stands in (TEST DOUBLES, an engine
needs a GPU): vLLM's app (``build_app``: one chat-completions route, decorated with vLLM's ``load_aware_call`` as
vLLM's own is, answering at once) and its state (``init_app_state``: the load tracking on, as Trinity's server
arguments set it) and the engine client (never errored). Prints one JSON line: the requests answered, the worker
threads anyio started for their background tasks (each one's Thread object kept, so none is counted twice), the load
counter after the last response (0: every decrement ran), requests/s at the client.
"""


import asyncio  # no `from __future__ import annotations`: FastAPI reads the route's annotations at run time
import json
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import ray


@ray.remote(num_cpus=0)
class EngineServer:
    async def start(self) -> int:
        import logging
        import socket
        from types import SimpleNamespace

        from fastapi import FastAPI
        from fastapi import Request
        from fastapi.responses import JSONResponse
        from starlette.background import BackgroundTask
        from vllm.entrypoints.serve.utils.api_utils import load_aware_call

        from trinity.common.models.vllm_patch import api_patch_v17 as m

        self.threads: list[threading.Thread] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        @load_aware_call
        async def chat(raw_request: Request):  # TEST DOUBLE for vLLM's chat route (its engine needs a GPU)
            return JSONResponse({"choices": []}, background=BackgroundTask(self.seen))

        engine = SimpleNamespace(errored=False, is_running=True, dead_error=None,
                                 vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(_api_process_rank=0)))

        async def init_app_state(engine_client, state, args):  # TEST DOUBLE: the state Trinity's arguments give
            state.engine_client = engine_client
            state.enable_server_load_tracking = True
            state.server_load_metrics = 0

        m.build_app = lambda args: app  # TEST DOUBLE: vLLM's app, less the routes that need an engine
        m.init_app_state = init_app_state
        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        args = SimpleNamespace(tool_parser_plugin="", reasoning_parser_plugin="", enable_ssl_refresh=False,
                               host="127.0.0.1", port=sock.getsockname()[1], uvicorn_log_level="warning",
                               disable_uvicorn_access_log=True, ssl_keyfile=None, ssl_certfile=None,
                               ssl_ca_certs=None, ssl_cert_reqs=0, h11_max_incomplete_event_size=None,
                               h11_max_header_count=None)
        self.server = asyncio.create_task(  # as Trinity's get_api_server does
            m.run_server_worker_in_ray(f"http://127.0.0.1:{args.port}", sock, args, engine, logging.getLogger("probe")))
        return args.port

    def seen(self) -> None:
        self.threads.append(threading.current_thread())

    async def report(self) -> dict:
        from trinity.common.models.vllm_patch import api_patch_v17 as m

        return {"switch": m._ANYIO_ROOT, "threads": len({id(t) for t in self.threads}), "calls": len(self.threads),
                "load": self.app.state.server_load_metrics}


def main() -> int:
    address, switch, n, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    env = {} if switch == "-" else {"RFTSTACK_ENGINE_ANYIO_ROOT": switch}
    actor = EngineServer.options(runtime_env={"env_vars": env}).remote()
    try:
        try:
            port = ray.get(actor.start.remote(), timeout=120)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:  # e.g. the switch's value refused
            print(json.dumps({"error": str(exc).strip().splitlines()[-1][:500]}))
            return 1
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(100):  # the server task binds after start() returned
            try:
                urllib.request.urlopen(urllib.request.Request(url, b"{}", method="POST"), timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)

        def post(_: int) -> int:
            return urllib.request.urlopen(urllib.request.Request(url, b"{}", method="POST"), timeout=30).status

        ray.get(actor.report.remote())
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            codes = list(pool.map(post, range(n)))
        dt = time.perf_counter() - t0
        time.sleep(0.5)  # the last background tasks run after their responses went out
        rep = ray.get(actor.report.remote())
        print(json.dumps({**rep, "answered": codes.count(200), "requests_per_s": round(n / dt, 1)}))
        return 0
    finally:
        ray.kill(actor)
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
