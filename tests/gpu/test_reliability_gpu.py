"""Reliability on a GPU (NOT RUN in the CPU session that wrote it; see docs/reliability.md):
bad requests answered by real vLLM through Trinity's proxy, 64 concurrent clients for a bounded
soak (RFTSTACK_SOAK_S, default 300 s), and SIGKILL of the vLLM engine: serve exits 1 with a
precise reason and every experience committed before the fault is still in the SQLite store.

Run on the GPU host:  python3 -m pytest -v tests/gpu/test_reliability_gpu.py   (file order matters)
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
import time
import urllib.error
import urllib.request

import pytest

from conftest import ServeRun, rftstack_env
from gpu_helpers import gpu_pids, has_gpu, post

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

SOAK_S = float(os.environ.get("RFTSTACK_SOAK_S", "300"))
CLIENTS = 64
CONFIG = """\
mode: serve
project: rel
name: soak
model: {{model_path: {model}, max_model_len: 2048}}
cluster: {{node_num: 1, gpu_per_node: 1}}
explorer: {{rollout_model: {{engine_num: 1, enable_openai_api: true, gpu_memory_utilization: 0.60}}}}
synchronizer: {{sync_method: checkpoint}}
"""


def raw_post(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from rftstack import supervisor, tinymodel

    tmp = tmp_path_factory.mktemp("rel")
    model = tinymodel.ensure(tmp / "cache" / "rftstack" / "tiny-model")
    cfg = tmp / "soak.yaml"
    cfg.write_text(CONFIG.format(model=model))
    run = ServeRun(["-c", str(cfg), "--num-gpus", "1", "--skip-doctor"], rftstack_env(XDG_CACHE_HOME=str(tmp / "cache")), tmp, tmp / "run")
    try:
        ready = run.wait_event("ready", timeout=900)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        ready["base"] = ready["endpoint"][: -len("/v1")]
        yield run, ready
    finally:
        run.kill()
        for tag in run.tags():
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)


def test_bad_requests_are_4xx(served):
    _, ready = served
    base, model = ready["base"], ready["model"]
    msgs = [{"role": "user", "content": "hi"}]
    code, body = raw_post(base + "/v1/chat/completions", b"{not json")
    assert code == 400 and "Invalid JSON" in body["detail"]
    code, body = raw_post(base + "/v1/chat/completions", json.dumps({"model": "nope", "messages": msgs}).encode())
    assert code == 404 and body["error"]["message"] == "The model `nope` does not exist."
    code, body = raw_post(base + "/v1/chat/completions", json.dumps({"model": model, "messages": msgs, "max_tokens": 10**9}).encode())
    assert code == 400 and "maximum context length is 2048" in body["error"]["message"]
    code, _ = raw_post(base + "/feedback", json.dumps({"msg_ids": ["chatcmpl-unknown"], "reward": 1.0}).encode())
    assert code in (200, 404)  # 404 with patches/trinity-proxy-feedback-errors.patch applied


def test_64_clients_soak(served):
    _, ready = served
    base, model = ready["base"], ready["model"]
    end = time.monotonic() + SOAK_S

    def client(i: int) -> tuple[int, int]:
        ok = bad = 0
        while time.monotonic() < end:
            try:
                r = post(base + "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": f"c{i} {ok}"}], "max_tokens": 16})
                post(base + "/feedback", {"msg_ids": [r["id"]], "reward": 1.0})
                ok += 1
            except Exception:
                bad += 1
        return ok, bad

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(client, range(CLIENTS)))
    post(base + "/commit", {})
    assert sum(b for _, b in results) == 0 and sum(o for o, _ in results) > CLIENTS


def test_engine_sigkill_keeps_committed_experiences(served):
    run, ready = served
    base, model = ready["base"], ready["model"]
    r = post(base + "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8})
    post(base + "/feedback", {"msg_ids": [r["id"]], "reward": 1.0})
    post(base + "/commit", {})
    time.sleep(3)
    db = ready["data"]["experience_buffer"][len("sqlite:///"):]
    before = sqlite3.connect(db).execute("select count(*) from experience_buffer").fetchone()[0]
    assert before > 0
    for pid in gpu_pids():
        os.kill(pid, signal.SIGKILL)
    assert run.finish(timeout=300) == 1
    assert "trinity exited with code" in run.stderr or "GCS died" in run.stderr
    assert sqlite3.connect(db).execute("select count(*) from experience_buffer").fetchone()[0] == before
    for tag in run.tags():
        from rftstack import supervisor

        assert supervisor.tagged(tag) == []
