"""The proxy's recording in a process of its own: what bench/proxy_overhead.py's variant ``sqlite-process``
measures. The proxy sends the upstream's answer as it came (bytes) with its model version over a Unix
socket and awaits this process's acknowledgement (the rows committed) before it answers its client, as
Trinity's proxy awaits its recorder today; parsing, building the experiences, serializing them and the SQL
write happen here, on another CPU, with Trinity's own code (``ExplorerService.record_experience`` and its
``HistoryRecorder``, the group-commit patch on as `rftstack relax` installs it; the objects of its start
frozen for the garbage collector, as the gc patch does in the proxy's process).

Frames (network byte order): a request is id (u64), model version (i64), length (u32) and the answer's
bytes; an acknowledgement is id (u64), ok (u8), length (u32) and a message: the number of experiences
recorded, or the error's one line.

    python bench/recorder_process.py --socket PATH --db-url sqlite:///FILE [--table proxy_history]

prints ``GROUP_COMMIT 1`` (or 0: whether the recorder's group-commit patch is on) and ``READY`` once it
listens; SIGINT or SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import struct
import sys

REQUEST = struct.Struct("!QqI")
ACK = struct.Struct("!QBI")


class RecorderClient:
    """The proxy's side: one connection to the recorder process, opened on first use on the running loop;
    any number of answers in flight on it, each awaited until its acknowledgement."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.connecting: asyncio.Lock | None = None

    async def record(self, body: bytes, model_version: int) -> int:
        """Record one upstream answer; the number of experiences it gave. Raises RuntimeError with the
        recorder's sentence when it could not record, or when the recorder process is gone."""
        if self.writer is None:
            await self._connect()
        assert self.writer is not None
        rid = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        self.writer.write(REQUEST.pack(rid, model_version, len(body)) + body)
        return await future

    async def _connect(self) -> None:
        if self.connecting is None:
            self.connecting = asyncio.Lock()
        async with self.connecting:
            if self.writer is None:
                try:
                    reader, self.writer = await asyncio.open_unix_connection(self.path)
                except OSError as exc:  # no process listens there (any more)
                    raise RuntimeError(f"the recorder process at {self.path} does not answer: {exc}") from exc
                self.reading = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                rid, ok, n = ACK.unpack(await reader.readexactly(ACK.size))
                message = (await reader.readexactly(n)).decode()
                future = self.pending.pop(rid, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(int(message))
                else:
                    future.set_exception(RuntimeError(message))
        except (asyncio.IncompleteReadError, ConnectionError):
            gone = RuntimeError(f"the recorder process at {self.path} closed its connection")
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(gone)
            self.pending.clear()
            self.writer = None


class RecordingService:
    """What ExplorerService.record_experience uses of its service: the recorder and the count."""

    def __init__(self, db_url: str, table: str) -> None:
        from trinity.explorer.proxy.recorder import HistoryRecorder

        self.recorder = HistoryRecorder(db_url=db_url, table_name=table)
        self.total_experience_count = 0


async def serve(path: str, db_url: str, table: str) -> None:
    from trinity.explorer.proxy import app as proxy_app
    from trinity.explorer.proxy.service import ExplorerService

    service = RecordingService(db_url, table)
    if getattr(proxy_app, "_GC_FREEZE", False):  # as the proxy's start does with the gc patch on
        print(f"{proxy_app._freeze_start()} objects frozen for the garbage collector", flush=True)
    tasks: set[asyncio.Task] = set()

    async def record(rid: int, model_version: int, body: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            response = proxy_app._fast_loads(body)
            await ExplorerService.record_experience(service, response, model_version)  # type: ignore[arg-type]
            ok, message = 1, str(len(response["choices"]))  # one experience a choice
        except Exception as exc:  # the proxy answers its client with this sentence
            ok, message = 0, f"the recorder process could not record the answer: {type(exc).__name__}: {exc}"
        data = message.encode()
        writer.write(ACK.pack(rid, ok, len(data)) + data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                rid, model_version, n = REQUEST.unpack(await reader.readexactly(REQUEST.size))
                task = asyncio.create_task(record(rid, model_version, await reader.readexactly(n), writer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await service.recorder.prepare()  # the table, before READY: a second recorder process on the file finds it
    server = await asyncio.start_unix_server(handle, path)
    print(f"GROUP_COMMIT {int(getattr(service.recorder, '_group_commit', False))}", flush=True)
    print("READY", flush=True)
    await stop.wait()
    server.close()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--db-url", required=True)
    ap.add_argument("--table", default="proxy_history")
    args = ap.parse_args(argv)
    asyncio.run(serve(args.socket, args.db_url, args.table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
