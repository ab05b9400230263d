"""Shared test code for the tests of Trinity's proxy: its real app and service code loaded from the
installed trinity-rft (with or without the policy's patches), a TEST DOUBLE of vLLM's chat endpoint,
and Trinity's proxy app in a child process (tests/doubles/trinity_proxy_host.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi import FastAPI

from rftstack.stack import patches
from rftstack.stack import policy
from rftstack.doctor.netstat import free_port

DOUBLES = Path(__file__).resolve().parent / "doubles"


class InThreadServer:
    """An ASGI app served by uvicorn in a thread of this process on a free loopback port (the tests'
    upstream doubles), as a context manager; ``config``: more uvicorn.Config settings."""

    def __init__(self, app, **config) -> None:
        import uvicorn

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])), daemon=True)

    def __enter__(self):
        self._thread.start()
        end = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < end and self._thread.is_alive(), "the upstream double did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def assert_bad_switch_stops_the_proxy(monkeypatch, work: Path, upstream: str, var: str) -> None:
    """A patch's switch ``var`` set to neither 0 nor 1: the proxy does not start, and what it printed names
    the variable and its values (the patch refuses the value when app.py is imported)."""
    monkeypatch.setenv(var, "yes")
    with pytest.raises(RuntimeError, match="the proxy exited") as e:
        Proxy(upstream, work, None)
    assert f"{var} must be 1" in str(e.value)


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


HELD_LOGS = itertools.count(1)


class Proxy:
    """Trinity's proxy app in a child process (its own session; killed on exit)."""

    def __init__(self, upstream: str, work: Path, site: Path | None, trace: bool = True, *, buffer: bool = False,
                 kill_in_commit: str | None = None, env: dict[str, str] | None = None, held: bool = False):  # fmt: skip
        """``buffer``: /commit also writes to an SQLite experience buffer (``self.buffer``) through
        Trinity's SQLExperienceStorage; ``kill_in_commit``: the host's fault point (before-write,
        after-write); ``env``: more environment for the proxy process. ``held``: start the process
        now but let it only import Trinity (seconds) until ``release()``, which gives it its port; then
        it opens its store and serves (a crash test's next process, on the store of the one before)."""
        work.mkdir(parents=True, exist_ok=True)
        self.db, self.commits = work / "proxy_history.db", work / "commits.jsonl"
        # a held proxy runs beside the one before it on the same ``work``: a log of its own
        self.log = work / (f"proxy.held{next(HELD_LOGS)}.log" if held else "proxy.log")
        self.buffer = work / "experience_buffer.db"
        self.port, self.base = 0, ""
        cmd = [sys.executable, str(DOUBLES / "trinity_proxy_host.py"), "--upstream", upstream,
               "--db", str(self.db), "--commits", str(self.commits)] + (["--trace"] if trace else []) + (["--trinity-site", str(site)] if site else [])  # fmt: skip
        cmd += (["--buffer", str(self.buffer)] if buffer else []) + (["--kill-in-commit", kill_in_commit] if kill_in_commit else [])
        cmd += ["--held"] if held else self._listen()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                                     stdin=subprocess.PIPE if held else None, env={**os.environ, **(env or {})})  # fmt: skip
        if not held:
            self._wait_healthy()

    def _listen(self) -> list[str]:
        """A free port for the proxy, chosen right before it binds it."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        return ["--port", str(self.port)]

    def release(self) -> Proxy:
        """A ``held`` proxy goes on: it gets its port, opens its store and serves; returns once it answers."""
        assert self.proc.stdin is not None, "release() is for a proxy started with held=True"
        self.proc.stdin.write(f"{self._listen()[1]}\n".encode())
        self.proc.stdin.close()
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        end = time.monotonic() + 240
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the proxy exited: {self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError("the proxy did not answer /health")
                time.sleep(0.3)
        started = re.search(r"^BUILDERS (\d+)$", self.log.read_text(), re.M)  # the host printed it before serving
        self.builders = self.ready_builders(int(started.group(1))) if started and int(started.group(1)) else []
        from openai import OpenAI

        self.client = OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=60)

    def ready_builders(self, count: int, limit_s: float = 180) -> list[int]:
        """The pids of the proxy's ``count`` experience builder or recording processes (patches/trinity-proxy-
        build-processes.patch, RFTSTACK_PROXY_BUILD_PROCESSES or _RECORD_PROCESSES) once each has said it is
        ready: the host starts them before it serves, and their imports take seconds; until then the proxy
        builds and records, as upstream. So every answer of a test goes through them."""
        end = time.monotonic() + limit_s
        while True:
            log = self.log.read_text()
            started = re.search(r"Experience (?:builder|recorder)s: (\d+) processes .* pids ([\d ]+)", log)
            ready = set(map(int, re.findall(r"Experience (?:builder|recorder) (\d+) ready", log)))
            if started and len(ready) == count:
                pids = [int(p) for p in started.group(2).split()]
                assert int(started.group(1)) == count and set(pids) == ready, log[-2000:]
                return pids
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"the proxy's {count} experience builders were not ready: {log[-3000:]}")
            time.sleep(0.2)

    def stream(self, content: str, max_tokens: int = 6, **kw) -> tuple[str, list]:
        chunks = list(self.client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens, stream=True, **kw))
        ids = {c.id for c in chunks}
        assert len(ids) == 1 and len(chunks) > 1
        return ids.pop(), chunks

    def rows(self) -> list[str]:
        if not self.db.exists():
            return []
        con = sqlite3.connect(self.db)
        try:
            return [m for (m,) in con.execute("select msg_id from proxy_history order by id")]
        except sqlite3.OperationalError as exc:  # a write cancelled before the table was made
            if "no such table" in str(exc):
                return []
            raise
        finally:
            con.close()

    def settled_rows(self, expect: int) -> list[str]:
        """The rows once no write is in flight (the proxy's log has as many RECORD ends as starts)."""
        for _ in range(100):
            log = self.log.read_text()
            if log.count("RECORD start") == log.count("RECORD done") + log.count("RECORD raised") and len(self.rows()) >= expect:
                break
            time.sleep(0.1)
        return self.rows()

    def commits_by_id(self) -> dict:
        if not self.commits.exists():
            return {}
        return {d["msg_id"]: d for d in map(json.loads, self.commits.read_text().splitlines())}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def stored(db: Path) -> tuple[str, dict[str, list[dict]]]:
    """integrity_check's answer and, per msg_id, its rows joined with the deserialized blobs."""
    from trinity.common.experience import Experience

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (check,) = con.execute("PRAGMA integrity_check").fetchone()
        rows: dict[str, list[dict]] = {}
        for msg_id, reward, consumed, task, blob in con.execute(
                "select h.msg_id, h.reward, h.consumed, h.task_id, b.experience_bytes "
                "from proxy_history h left join proxy_history_blob b on b.id = h.id order by h.id"):
            exp = Experience.deserialize(blob) if blob is not None else None
            rows.setdefault(msg_id, []).append({"reward": reward, "consumed": consumed, "task": task, "exp": exp})
        return check, rows
    finally:
        con.close()


def assert_intact(row: dict, sent: dict) -> None:
    """The row's blob holds exactly the prompt, the completion and the logprobs vLLM (the double) sent."""
    exp = row["exp"]
    assert exp is not None, "a meta row without its blob"
    n = exp.prompt_length
    assert exp.tokens[:n].tolist() == sent["prompt_token_ids"]
    assert exp.tokens[n:].tolist() == sent["token_ids"]
    assert exp.logprobs.tolist() == pytest.approx(sent["logprobs"])


def load_app(patched: bool, tmp: Path):
    """Trinity's app.py and service.py, optionally with the feedback patch, as private modules."""
    import trinity

    site = Path(trinity.__file__).parents[1]
    (p,) = [p for p in policy.load().patches if p.file == "trinity-proxy-feedback-errors.patch"]
    texts = {}
    for fp in patches.parse((patches.patches_dir() / p.file).read_text()):
        text = patches.undo((site / fp.path).read_text(), patches.patches_dir() / p.file, fp.path)  # the original
        texts[fp.path] = patches.apply_text(text, fp)[0] if patched else text
    mods = {}
    for rel, text in texts.items():
        name = f"proxy_{'patched' if patched else 'orig'}_{Path(rel).stem}"
        path = tmp / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        mods[Path(rel).stem] = mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mods["app"], mods["service"]


class Service:
    """The ExplorerService parts app.py calls; record_* are Trinity's own, on its SQLite recorder."""

    def __init__(self, service_mod, db: Path):
        from trinity.explorer.proxy.recorder import HistoryRecorder

        self.recorder = HistoryRecorder(db_url=f"sqlite:///{db}", table_name="proxy_history")
        self.total_experience_count = self.ready_experience_count = 0
        self.ready_experiences = []
        self.record_experience = service_mod.ExplorerService.record_experience.__get__(self)
        self.record_feedback = service_mod.ExplorerService.record_feedback.__get__(self)

    async def allocate_model(self, increase_count: bool = True):
        return "http://upstream", 0


def upstream() -> FastAPI:
    """TEST DOUBLE of vLLM's chat endpoint: a new response id per request, token ids and logprobs."""
    up = FastAPI()
    ids = itertools.count(1)

    @up.post("/v1/chat/completions")
    async def chat(body: dict):
        n = next(ids)
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2, 3] * 40,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": list(range(64)),
                             "logprobs": {"content": [{"logprob": -0.1}] * 64}, "finish_reason": "stop"}]}  # fmt: skip

    return up
