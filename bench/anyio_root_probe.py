"""Child process of bench/anyio_root.py and tests/stack/test_engine_anyio_root.py: Trinity's engine API server as its
engine actor runs it, on a real Ray async actor's loop, with the installed (patched) Trinity's real
``run_server_worker_in_ray`` and vLLM's real ``serve_http`` (uvicorn) and ``load_aware_call``; or, for comparison, the
same server as ``vllm serve`` runs one: in a plain process of its own, on ``uvloop.run()``'s loop in the main thread.

    python anyio_root_probe.py RAY_ADDRESS SWITCH REQUESTS CONCURRENCY
    python anyio_root_probe.py plain SWITCH REQUESTS CONCURRENCY

SWITCH is RFTSTACK_ENGINE_ANYIO_ROOT in the server's environment ("-": unset). What stands in (TEST DOUBLES, an engine
needs a GPU): vLLM's app (``build_app``: one chat-completions route, decorated with vLLM's ``load_aware_call`` as
vLLM's own is, answering at once) and its state (``init_app_state``: the load tracking on, as Trinity's server
arguments set it) and the engine client (never errored). Prints one JSON line: the requests answered, the worker
threads anyio started for their background tasks (each one's Thread object kept, so none is counted twice), the load
counter after the last response (0: every decrement ran), requests/s at the client, the CPU time a request of the
server's loop thread and of its whole process (``/probe/report`` before and after the timed requests, less the fixed
work's), and the median CPU and wall time of ``fixed_work``, which the loop runs every 5 ms, while the requests ran.
"""


import asyncio  # no `from __future__ import annotations`: FastAPI reads the route's annotations at run time
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SWITCH_VAR = "RFTSTACK_ENGINE_ANYIO_ROOT"
_SERVERS: set = set()  # the server's tasks, referenced while they run
TICK_S = 0.005


class _Out:  # what fixed_work makes, like the small objects an output handler makes a response
    __slots__ = ("id", "tokens", "text")

    def __init__(self, id_: int, tokens: list, text: str):
        self.id, self.tokens, self.text = id_, tokens, text


def fixed_work(n: int = 200) -> int:
    """A fixed piece of pure-Python work: small dicts, lists, strings and objects, as vLLM's output processing makes."""
    made = []
    for i in range(n):
        d = {"id": i, "tokens": [i, i + 1, i + 2], "text": str(i)}
        made.append(_Out(d["id"], d["tokens"], d["text"] + "-"))
    return len(made)


async def start_server() -> int:
    """The engine's API server (TEST DOUBLE app and engine client) on the running loop, as Trinity's get_api_server
    starts it; its port. Answers POST /v1/chat/completions and GET /probe/report."""
    import logging
    import socket
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.background import BackgroundTask
    from vllm.entrypoints.serve.utils.api_utils import load_aware_call

    from trinity.common.models.vllm_patch import api_patch_v17 as m

    threads: list[threading.Thread] = []
    app = FastAPI()

    def seen() -> None:
        threads.append(threading.current_thread())

    @app.post("/v1/chat/completions")
    @load_aware_call
    async def chat(raw_request: Request):  # TEST DOUBLE for vLLM's chat route (its engine needs a GPU)
        return JSONResponse({"choices": []}, background=BackgroundTask(seen))

    ticks: list[tuple[int, int]] = []  # the fixed work's (CPU ns, wall ns) on the loop, one a tick

    async def ticker() -> None:
        """Every TICK_S, fixed_work() on the server's loop thread: what the same Python work costs there (vLLM's output
        handler runs on that loop in the engine's server) while the server answers."""
        while True:
            await asyncio.sleep(TICK_S)
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            fixed_work()
            ticks.append((time.thread_time_ns() - c0, time.perf_counter_ns() - w0))

    @app.get("/probe/report")
    async def report(since: int = 0):  # runs on the server's loop thread, so thread_time() is that thread's CPU
        window = ticks[since:]
        return {"switch": m._ANYIO_ROOT, "threads": len({id(t) for t in threads}), "calls": len(threads),
                "load": app.state.server_load_metrics, "loop_thread_cpu_s": time.thread_time(),
                "process_cpu_s": time.process_time(), "ticks": len(ticks),
                "ticks_cpu_s": sum(c for c, _ in ticks) / 1e9,
                "fixed_work_cpu_us": round(statistics.median(c for c, _ in window) / 1e3, 1) if window else None,
                "fixed_work_wall_us": round(statistics.median(w for _, w in window) / 1e3, 1) if window else None}

    engine = SimpleNamespace(errored=False, is_running=True, dead_error=None,
                             vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(_api_process_rank=0)))

    async def init_app_state(engine_client, state, args):  # TEST DOUBLE: the state Trinity's arguments give
        state.engine_client = engine_client
        state.enable_server_load_tracking = True
        state.server_load_metrics = 0

    m.build_app = lambda args: app  # TEST DOUBLE: vLLM's app, less the routes that need an engine
    m.init_app_state = init_app_state
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    args = SimpleNamespace(tool_parser_plugin="", reasoning_parser_plugin="", enable_ssl_refresh=False,
                           host="127.0.0.1", port=sock.getsockname()[1], uvicorn_log_level="warning",
                           disable_uvicorn_access_log=True, ssl_keyfile=None, ssl_certfile=None,
                           ssl_ca_certs=None, ssl_cert_reqs=0, h11_max_incomplete_event_size=None,
                           h11_max_header_count=None)
    _SERVERS.add(asyncio.create_task(ticker()))
    _SERVERS.add(asyncio.create_task(  # as Trinity's get_api_server does
        m.run_server_worker_in_ray(f"http://127.0.0.1:{args.port}", sock, args, engine, logging.getLogger("probe"))))
    return args.port


def serve_plain() -> int:
    """``--plain-server``: the server on uvloop.run()'s loop in this process's main thread, as `vllm serve` runs
    its own; prints {"port": N} and serves until stdin closes."""
    import uvloop

    async def main() -> None:
        print(json.dumps({"port": await start_server()}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    uvloop.run(main())
    return 0


def actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class EngineServer:
        async def start(self) -> int:
            return await start_server()

    return EngineServer


def post(url: str, body: bytes = b"{}") -> int:
    """POST ``body`` to ``url``: the answer's status (the body is read, so the connection is done with)."""
    with urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=30) as answer:
        answer.read()
        return answer.status


def load(base: str, n: int, c: int) -> dict:
    """Wait for the server, then ``n`` requests from ``c`` clients: the report's counts and the CPU a request."""
    url = f"{base}/v1/chat/completions"
    for _ in range(100):  # the server task binds after start() returned
        try:
            post(url)
            break
        except OSError:
            time.sleep(0.1)

    def report(query: str = "") -> dict:
        return json.loads(urllib.request.urlopen(f"{base}/probe/report{query}", timeout=30).read())

    before = report()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        codes = list(pool.map(post, [url] * n))
    dt = time.perf_counter() - t0
    during = report(f"?since={before['ticks']}")  # the fixed work's ticks while the requests ran
    for _ in range(100):  # the last background tasks run after their responses went out: wait for them (up to 10 s)
        after = report()
        if after["load"] == 0:
            break
        time.sleep(0.1)
    ticker = after["ticks_cpu_s"] - before["ticks_cpu_s"]  # the fixed work's CPU is not the server's
    per = {"loop_thread_ms_per_request": round((after["loop_thread_cpu_s"] - before["loop_thread_cpu_s"] - ticker)
                                               * 1000 / n, 4),
           "process_ms_per_request": round((after["process_cpu_s"] - before["process_cpu_s"] - ticker) * 1000 / n, 4)}
    keep = {k: after[k] for k in ("switch", "threads", "calls", "load")}
    keep.update({k: during[k] for k in ("fixed_work_cpu_us", "fixed_work_wall_us")})
    keep["fixed_work_ticks"] = during["ticks"] - before["ticks"]
    return {**keep, **per, "answered": codes.count(200), "requests_per_s": round(n / dt, 1)}


def run_plain(env: dict, n: int, c: int) -> int:
    with tempfile.TemporaryFile("w+") as err:
        return _run_plain(env, n, c, err)


def _run_plain(env: dict, n: int, c: int, err) -> int:
    server = subprocess.Popen([sys.executable, __file__, "--plain-server"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **env})
    try:
        line = server.stdout.readline()
        while line and not line.startswith('{"port"'):  # vLLM's and uvicorn's log lines before it
            line = server.stdout.readline()
        if not line:  # it ended first, e.g. the switch's value refused at import
            server.wait(timeout=60)
            err.seek(0)
            lines = err.read().strip().splitlines() or [f"exit {server.returncode}"]
            print(json.dumps({"error": lines[-1][:500], "server": "plain"}))
            return 1
        threading.Thread(target=server.stdout.read, daemon=True).start()  # its later log lines, so it never blocks
        print(json.dumps({**load(f"http://127.0.0.1:{json.loads(line)['port']}", n, c), "server": "plain"}))
        return 0
    finally:
        if server.poll() is None:
            server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def run_actor(address: str, env: dict, n: int, c: int) -> int:
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    actor = actor_class().options(runtime_env={"env_vars": env}).remote()
    try:
        try:
            port = ray.get(actor.start.remote(), timeout=120)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:  # e.g. the switch's value refused
            print(json.dumps({"error": str(exc).strip().splitlines()[-1][:500], "server": "ray-actor"}))
            return 1
        print(json.dumps({**load(f"http://127.0.0.1:{port}", n, c), "server": "ray-actor"}))
        return 0
    finally:
        ray.kill(actor)
        ray.shutdown()


def main() -> int:
    if sys.argv[1:] == ["--plain-server"]:
        return serve_plain()
    address, switch, n, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    env = {} if switch == "-" else {SWITCH_VAR: switch}
    return run_plain(env, n, c) if address == "plain" else run_actor(address, env, n, c)


if __name__ == "__main__":
    sys.exit(main())
