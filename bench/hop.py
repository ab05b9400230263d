"""A forwarding hop in front of an OpenAI server: a measuring instrument for bench/interleave.py, NOT Trinity's proxy
(it keeps no experience, so it must never stand in front of users).

Through Trinity's proxy its engine's steps are longer than when the same request goes to the engine straight
(docs/benchmarks.md section 1, sessions AO and AP: the GPU idle longer between steps), and a request spends 7-15 ms
more outside the engine. Which part of the proxy does that: any hop in front of the engine, the time an answer
spends in it (the proxy's commit wait), or its serial work on one event loop (the proxy's parsing, building and
writing, answer after answer)? This hop has each as a setting:

- it receives a chat completion, adds what Trinity's proxy adds (``return_token_ids``, ``logprobs`` and, unless
  ``--fields json``, the numeric-logprobs mark of patches/trinity-proxy-numeric-logprobs.patch), forwards it with
  aiohttp, reads the whole answer and returns its bytes as they came;
- ``--wait-ms W``: each answer is held W ms before it is returned (``asyncio.sleep``: time without CPU);
- ``--busy-ms B``: for each answer the event loop is kept busy B ms (a spin: serial work, as the proxy's own);
- ``--group-ms G``: each answer waits for a group commit whose commit is a sleep of G ms (no I/O, no CPU): the answers
  that arrive while one runs are released together when the next one ends, as the proxy's group commit releases
  them; the release pattern without the store;
- ``--store PATH``: each answer's bytes are a row of an SQLite file at PATH, committed before the answer is returned,
  the answers in hand sharing one transaction (a group commit, as Trinity's recorder with
  patches/trinity-recorder-group-commit.patch) on a thread of its own, with SQLite's defaults otherwise (a rollback
  journal and ``synchronous=FULL``, as Trinity's store: every commit syncs the file to its disk). Not an experience
  store: the write and its syncs alone, without Trinity's building, serializing and SQLAlchemy.

Any other path (``GET /v1/models``, ``/metrics``) is forwarded as it is. ``GET /hop/stats`` gives its counts.

    python bench/hop.py --upstream http://127.0.0.1:PORT [--port 0] [--wait-ms 0] [--busy-ms 0] [--fields numeric] \
        [--group-ms G | --store PATH]
    # prints "URL http://127.0.0.1:PORT" once it listens; serves until SIGINT/SIGTERM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

FIELDS = ("numeric", "json")
NUMERIC_KEY = "rftstack_logprobs_numeric"


def add_fields(body: dict, fields: str) -> dict:
    """What Trinity's proxy adds to a request before it forwards it (its temperature aside: the load's own)."""
    if fields == "numeric" and not body.get("logprobs") and not body.get("top_logprobs") and not body.get("stream"):
        xargs = body.get("vllm_xargs")
        if xargs is None or isinstance(xargs, dict):
            body["vllm_xargs"] = {**(xargs or {}), NUMERIC_KEY: 1}
    body["return_token_ids"] = True
    body["logprobs"] = True
    return body


def spin(ms: float) -> None:
    """Hold the calling thread (the event loop) busy for ``ms`` milliseconds."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


class Gate:
    """A group commit whose commit is ``asyncio.sleep(ms)``: :meth:`put` returns when the first commit that starts
    after it was called has ended; the calls that arrive during a commit share the next one."""

    def __init__(self, ms: float):
        self.ms = ms
        self.commits = 0
        self.rows = 0
        self._waiting: list[asyncio.Future] = []
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def put(self, body: bytes) -> None:
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        self._wake.set()
        await done

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, []
            await asyncio.sleep(self.ms / 1000)
            self.commits += 1
            self.rows += len(batch)
            for done in batch:
                if not done.done():
                    done.set_result(None)

    def close(self) -> None:
        self._task.cancel()


class Store:
    """Answers' bytes as rows of the SQLite file ``path``, written by one thread: :meth:`put` returns once its row is
    committed; the rows that arrived while a commit ran go in the next one together (a group commit)."""

    def __init__(self, path: Path):
        self.rows = 0
        self.commits = 0
        self.commit_s = 0.0  # the time the commits took, summed
        self._q: queue.Queue = queue.Queue()
        self._con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # BEGIN/COMMIT by hand
        self._con.execute("CREATE TABLE IF NOT EXISTS answers (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self._thread = threading.Thread(target=self._run, name="hop-store", daemon=True)
        self._thread.start()

    async def put(self, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._q.put((body, loop, done))
        await done

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
        self._con.close()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            batch = [item]
            while True:
                try:
                    more = self._q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._q.put(None)  # ends the loop after this batch
                    break
                batch.append(more)
            error: BaseException | None = None
            t0 = time.perf_counter()
            try:
                self._con.execute("BEGIN")
                self._con.executemany("INSERT INTO answers (body) VALUES (?)", [(b,) for b, _, _ in batch])
                self._con.execute("COMMIT")
                self.rows += len(batch)
                self.commits += 1
                self.commit_s += time.perf_counter() - t0
            except sqlite3.Error as e:
                error = e
                if self._con.in_transaction:
                    self._con.execute("ROLLBACK")
            for _, loop, done in batch:
                loop.call_soon_threadsafe(_settle, done, error)


def _settle(done: asyncio.Future, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(None)


def make_app(upstream: str, *, wait_ms: float = 0.0, busy_ms: float = 0.0, fields: str = "numeric",
             store: Path | None = None, group_ms: float = 0.0):
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    stats = {"requests": 0, "answers": 0, "errors": 0, "wait_ms": wait_ms, "busy_ms": busy_ms, "fields": fields,
             "store": str(store) if store else None, "group_ms": group_ms}
    hop_by_hop = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length", "date", "server"}

    async def start(app):
        app["session"] = ClientSession(connector=TCPConnector(limit=1000), auto_decompress=False,
                                       timeout=ClientTimeout(total=None, sock_read=300))
        app["store"] = Store(store) if store else Gate(group_ms) if group_ms else None

    async def close(app):
        await app["session"].close()
        if app["store"] is not None:
            app["store"].close()

    def reply(status: int, body: bytes, headers) -> web.Response:
        kept = {k: v for k, v in headers.items() if k.lower() not in hop_by_hop}
        return web.Response(status=status, body=body, headers=kept)

    async def chat(request: web.Request) -> web.Response:
        stats["requests"] += 1
        try:
            body = add_fields(json.loads(await request.read()), fields)
        except (ValueError, AttributeError):
            stats["errors"] += 1
            return web.json_response({"error": {"message": "the hop takes a JSON object", "code": 400}}, status=400)
        async with request.app["session"].post(upstream + "/v1/chat/completions", data=json.dumps(body).encode(),
                                               headers={"content-type": "application/json"}) as up:
            content = await up.read()
            status, headers = up.status, up.headers
        if busy_ms:
            spin(busy_ms)
        if wait_ms:
            await asyncio.sleep(wait_ms / 1000)
        if status == 200 and request.app["store"] is not None:
            try:
                await request.app["store"].put(content)
            except sqlite3.Error as e:
                stats["errors"] += 1
                return web.json_response({"error": {"message": f"the hop's store failed ({e}): {store}", "code": 503}},
                                         status=503)
        stats["answers" if status == 200 else "errors"] += 1
        return reply(status, content, headers)

    async def other(request: web.Request) -> web.Response:
        async with request.app["session"].request(request.method, upstream + request.path_qs,
                                                  data=await request.read() or None) as up:
            return reply(up.status, await up.read(), up.headers)

    async def hop_stats(request: web.Request) -> web.Response:
        kept = request.app["store"]
        if kept is None:
            return web.json_response(stats)
        timing = {"commit_ms_mean": round(1000 * kept.commit_s / kept.commits, 3) if kept.commits else None} \
            if isinstance(kept, Store) else {}
        return web.json_response({**stats, "rows": kept.rows, "commits": kept.commits, **timing})

    app = web.Application(client_max_size=32 * 1024 * 1024)
    app.on_startup.append(start)
    app.on_cleanup.append(close)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/hop/stats", hop_stats)
    app.router.add_route("*", "/{tail:.*}", other)
    app["stats"] = stats
    return app


def check(args) -> str | None:
    """One sentence naming what is wrong with the arguments and how to fix it, or None."""
    if not args.upstream.startswith(("http://", "https://")):
        return f"--upstream {args.upstream!r}: give the OpenAI server's base URL, e.g. http://127.0.0.1:8000"
    if args.wait_ms < 0 or args.busy_ms < 0 or args.group_ms < 0:
        return "--wait-ms, --busy-ms and --group-ms are milliseconds: give 0 or more"
    if args.group_ms and args.store:
        return "--group-ms stands in for a store's commit: give it or --store, not both"
    if not 0 <= args.port < 65536:
        return f"--port {args.port}: give 0 (any free port) or a port number below 65536"
    if args.store and not Path(args.store).parent.is_dir():
        return f"--store {args.store}: no such directory {Path(args.store).parent}; give a file in an existing directory"
    return None


async def serve(args) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(args.upstream.rstrip("/"), wait_ms=args.wait_ms, busy_ms=args.busy_ms,
                                    fields=args.fields, store=Path(args.store) if args.store else None,
                                    group_ms=args.group_ms),
                           access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"URL http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="the OpenAI server's base URL (Trinity's engine)")
    ap.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--wait-ms", type=float, default=0.0, help="hold each answer this long before returning it")
    ap.add_argument("--busy-ms", type=float, default=0.0, help="keep the event loop busy this long for each answer")
    ap.add_argument("--fields", choices=FIELDS, default="numeric",
                    help="the proxy's fields with numeric logprobs (its default) or JSON logprobs")
    ap.add_argument("--group-ms", type=float, default=0.0,
                    help="release the answers in groups, each group's commit a sleep of this long (no I/O)")
    ap.add_argument("--store", default="", help="commit each answer's bytes to this SQLite file before returning it")
    args = ap.parse_args(argv)
    problem = check(args)
    if problem:
        print(f"hop: {problem}", file=sys.stderr)
        return 2
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
