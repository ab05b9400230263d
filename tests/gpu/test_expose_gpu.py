"""`rftstack serve --expose` on a real GPU: the API key reaches Trinity's proxy inside the Explorer
actor (through this serve's Ray head), every route asks for it, a refused request records nothing,
only the proxy listens beyond loopback, and the key is in no file but its own (run directory, Ray's
session logs, Trinity's and vLLM's logs).

Run on the GPU host (stack installed, policy patches applied):
    python3 -m pytest -q tests/gpu/test_expose_gpu.py
Skipped where there is no NVIDIA GPU.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import urllib.error
import urllib.request

import pytest

from rftstack.doctor import netstat
from rftstack.run import apikey, supervisor

from helpers import ServeRun, rftstack_env
from gpu_helpers import has_gpu

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)


def call(url: str, key: str | None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_expose_asks_for_the_key_through_the_real_explorer(tmp_path):
    env = rftstack_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    before = {(l.address, l.port) for l in netstat.listeners() if not l.loopback}  # the host's own, e.g. sshd
    run = ServeRun(["--num-gpus", "1", "--expose", "--port", "0"], env, tmp_path, tmp_path / "run")
    tags: list[str] = []
    try:
        ready = run.wait_event("ready", timeout=1200)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        tags = run.tags()
        base = ready["endpoint"][: -len("/v1")]
        (key_file,) = list((tmp_path / "run").rglob(apikey.FILE_NAME))
        key = key_file.read_text().strip()
        assert f"OPENAI_API_KEY={key}" in run.stderr_text()

        chat = {"model": ready["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        for k in (None, "rfts-wrong"):
            for path, body in (("/health", None), ("/v1/models", None), ("/metrics", None), ("/v1/chat/completions", chat),
                               ("/feedback", {"reward": 1, "msg_ids": ["x"]}), ("/commit", {})):
                status, out = call(base + path, k, body)
                assert status == 401 and out["error"]["type"] == "authentication_error", (path, k, status, out)
        status, out = call(base + "/v1/chat/completions", key, chat)
        assert status == 200, out
        assert call(base + "/feedback", key, {"reward": 1.0, "msg_ids": [out["id"]], "task_id": "t", "run_id": 0})[0] == 200
        assert call(base + "/commit", key, {})[0] == 200
        db = ready["data"]["proxy_history"].removeprefix("sqlite:///")
        con = sqlite3.connect(db)
        assert [m for (m,) in con.execute("select msg_id from proxy_history")] == [out["id"]]  # the refused chats left no row
        con.close()

        # Every socket that listens off loopback now and did not before the serve started: the
        # proxy's alone. Counted on the whole host, not by process: the Explorer actor runs in a Ray
        # worker whose environment (and so the run's tag) is not always readable from /proc.
        listening = netstat.listeners()
        outside = {(l.address, l.port) for l in listening if not l.loopback} - before
        by_inode = {l.inode: l for l in listening}
        owned = {(l.address, l.port, p.pid) for tag in tags for p in supervisor.tagged(tag)
                 for i in netstat.socket_inodes(p.pid) if (l := by_inode.get(i)) is not None}  # fmt: skip
        print(f"off loopback since the start: {sorted(outside)}; sockets found by the run's tag: {len(owned)}")
        assert {port for _, port in outside} == {int(base.rsplit(":", 1)[1])}, outside  # only the proxy

        run.proc.send_signal(signal.SIGINT)
        assert run.finish(timeout=300) == 0
        ray_dir = (tmp_path / "run" / "ray").resolve()
        files = [p for d in (tmp_path / "run", ray_dir) for p in d.rglob("*") if p.is_file() and not p.is_symlink() and p != key_file]
        assert len(files) > 20
        assert [str(p) for p in files if key.encode() in p.read_bytes()] == []
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()
        for tag in tags:
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)
