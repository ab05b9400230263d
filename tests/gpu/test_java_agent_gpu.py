"""The example Java agent (examples/java/Agent.java: the JDK's default HttpClient, no libraries)
against `rftstack serve` with the report's config: 8 agents at once, each chat x4, one streamed
chat, /feedback with its ids, /commit; then every msg id it printed must be a proxy_history row
with the agent's reward and a committed experience in the experience buffer.

Either against a serve that is already running (RFTSTACK_RUN_DIR=its run directory: status.json
gives the endpoint and the stores), or it starts its own (the report's config on the tiny model,
as test_rl_loop_gpu.py does; needs the GPU). Java: $JAVA (default `java` on PATH; the GPU host has
no JDK, pass a jlink runtime's bin/java); the classes: $AGENT_CLASSES, else compiled here with
`javac --release 17` when javac exists.

    JAVA=/opt/jre17/bin/java AGENT_CLASSES=/tmp/agent-classes python3 -m pytest -v tests/gpu/test_java_agent_gpu.py
    (add RFTSTACK_RUN_DIR=/path/to/run to use a running serve)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENTS, CHATS = 8, 4

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def java() -> str:
    exe = os.environ.get("JAVA") or shutil.which("java")
    if not exe or not Path(exe).exists() and not shutil.which(exe):
        pytest.skip("no java: set JAVA to a Java 17+ binary (e.g. a jlink runtime's bin/java)")
    return exe


def agent_classes(tmp: Path) -> Path:
    given = os.environ.get("AGENT_CLASSES")
    if given:
        assert (Path(given) / "Agent.class").is_file(), f"AGENT_CLASSES={given} has no Agent.class"
        return Path(given)
    if not shutil.which("javac"):
        pytest.skip("no AGENT_CLASSES and no javac: compile examples/java/Agent.java with `javac --release 17 -d DIR` and set AGENT_CLASSES=DIR")
    subprocess.run(["javac", "--release", "17", "-d", str(tmp), str(REPO / "examples/java/Agent.java")], check=True, timeout=300)
    return tmp


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """(endpoint base without /v1, status data) of a running serve, or of one started here."""
    run_dir = os.environ.get("RFTSTACK_RUN_DIR")
    if run_dir:
        status = json.loads((Path(run_dir) / "status.json").read_text())
        assert status.get("phase") == "ready", f"{run_dir} is not a ready serve: phase {status.get('phase')}"
        yield status["endpoint"].removesuffix("/v1"), status["data"]
        return
    from gpu_helpers import has_gpu

    if not has_gpu():
        pytest.skip("no NVIDIA GPU here and no RFTSTACK_RUN_DIR of a running serve")
    from helpers import ServeRun, rftstack_env
    from rftstack.run import report_config, supervisor, tinymodel

    tmp = tmp_path_factory.mktemp("java")
    model = tinymodel.ensure(tmp / "cache" / "rftstack" / "tiny-model")
    cfg = report_config.write(tmp / "qwen3b.yaml", model, max_model_len=2048)
    run = ServeRun(["-c", str(cfg), "--num-gpus", "1"], rftstack_env(XDG_CACHE_HOME=str(tmp / "cache")), tmp, tmp / "run")
    try:
        ready = run.wait_event("ready", timeout=900)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        yield ready["endpoint"].removesuffix("/v1"), ready["data"]
    finally:
        run.kill()
        for tag in run.tags():
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)


def rewards(db_url: str, ids: set[str]) -> dict[str, float]:
    """msg_id -> reward of the rows for ``ids`` in every table of an SQLite store that has both columns."""
    db = db_url.removeprefix("sqlite:///")
    if not Path(db).exists():
        return {}
    con = sqlite3.connect(db)
    try:
        out = {}
        for (t,) in con.execute("select name from sqlite_master where type='table'"):
            cols = [c[1] for c in con.execute(f'pragma table_info("{t}")')]
            if "msg_id" in cols and "reward" in cols:
                out.update({m: r for m, r in con.execute(f'select msg_id, reward from "{t}"') if m in ids})
        return out
    finally:
        con.close()


def test_eight_jdk_default_agents_land_every_response(serve, tmp_path):
    base, data = serve
    cmd = [java(), "-cp", str(agent_classes(tmp_path)), "Agent", base, "--agents", str(AGENTS), "--chats", str(CHATS)]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    summary = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    print(json.dumps({"wall_s": round(wall, 1), **{k: v for k, v in summary.items() if k != "msg_ids"}, "msg_ids": len(summary.get("msg_ids", []))}))
    assert r.returncode == 0 and summary["requests_failed"] == 0, (r.stdout[-3000:], r.stderr[-3000:])
    ids = set(summary["msg_ids"])
    assert len(summary["msg_ids"]) == len(ids) == AGENTS * (CHATS + 1)
    assert summary["requests_ok"] == AGENTS * (CHATS + 1 + 2) and summary["rewarded"] == len(ids)
    assert summary["http"].startswith("default")
    history = rewards(data["proxy_history"], ids)
    assert history == {m: 1.0 for m in ids}, f"{len(history)} of {len(ids)} in proxy_history"
    committed: dict = {}
    for _ in range(60):  # Trinity's buffer writer actor writes the committed experiences
        committed = rewards(data["experience_buffer"], ids)
        if len(committed) == len(ids):
            break
        time.sleep(1)
    assert committed == {m: 1.0 for m in ids}, f"{len(committed)} of {len(ids)} committed"
    print(json.dumps({"proxy_history_rows": len(history), "committed_rows": len(committed)}))
