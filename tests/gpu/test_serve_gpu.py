"""`rftstack serve` on a real GPU with no config at all: the embedded default, end to end.

The report's config through `rftstack serve` is tests/gpu/test_rl_loop_gpu.py.

Run on the GPU host (stack installed system-wide or in a venv):
    python3 -m pytest -q tests/gpu/test_serve_gpu.py
Skipped where there is no NVIDIA GPU. Checks: ready, an OpenAI-client chat completion, /feedback
and /commit, the committed experiences on disk, nothing of the serve's process tree listening
outside loopback, SIGINT stops everything, no process left, GPU memory back.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time

import pytest

from rftstack.doctor import netstat
from rftstack.run import supervisor

from helpers import ServeRun, rftstack_env
from gpu_helpers import gpu_memory_used_mib, gpu_pids, has_gpu, memory_back_after, post

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)



def test_embedded_default_end_to_end(tmp_path):
    cache = tmp_path / "cache"
    args = ["--num-gpus", "1"]
    baseline = gpu_memory_used_mib()
    env = rftstack_env(XDG_CACHE_HOME=str(cache))
    run = ServeRun(args, env, tmp_path, tmp_path / "run")  # python -m rftstack serve --json --run-dir ...
    proc = run.proc
    tags: list[str] = []
    try:
        ready = run.wait_event("ready", timeout=1200)
        assert ready, (run.finish(), run.stderr[-5000:])
        tags = run.tags()
        endpoint = ready["endpoint"]
        base = endpoint[: -len("/v1")]
        assert endpoint.startswith("http://127.0.0.1:")

        from openai import OpenAI

        client = OpenAI(base_url=endpoint, api_key="unused")
        model = client.models.list().data[0].id
        ids = []
        for i in range(3):
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=16)
            assert r.choices[0].message.content is not None
            ids.append(r.id)
        assert post(base + "/feedback", {"reward": 1.0, "msg_ids": ids, "task_id": "t1", "run_id": 0}).get("status") == "success"
        assert post(base + "/commit", {}).get("status") == "success"

        # nothing of the serve's process tree listens outside loopback
        by_inode = {l.inode: l for l in netstat.listeners()}
        socks = [(p.pid, p.cmdline[:60], by_inode[i]) for tag in tags for p in supervisor.tagged(tag)
                 for i in netstat.socket_inodes(p.pid) if i in by_inode]  # fmt: skip
        assert socks
        outside = [(pid, cmd, l.address, l.port) for pid, cmd, l in socks if not l.loopback]
        assert outside == [], outside

        # committed experiences are on disk (SQLite) under the run directory
        time.sleep(5)
        db = ready["data"]["experience_buffer"].removeprefix("sqlite:///")
        assert db.startswith(str(tmp_path / "run"))
        con = sqlite3.connect(db)
        tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
        assert sum(con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables) > 0
        con.close()
        ours = {p.pid for tag in tags for p in supervisor.tagged(tag)}
        assert gpu_pids() & ours, "the engine's GPU process is not one of the serve's processes?"

        proc.send_signal(signal.SIGINT)
        assert run.finish(timeout=300) == 0, run.stderr[-5000:]
        for tag in tags:
            assert supervisor.tagged(tag) == []
        assert not (gpu_pids() & ours)
        assert memory_back_after(baseline, 30) is not None
        assert json.loads((tmp_path / "run" / "status.json").read_text())["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for tag in tags:
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)
