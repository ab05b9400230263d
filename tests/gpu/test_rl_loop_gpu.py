"""The whole user story on a GPU, through `rftstack serve` with the report's shape of config
(engine_num 1, gpu_memory_utilization 0.60, sync_method nccl in the file):

an OpenAI client (plain, streamed, with tools, 16 at once) -> /feedback -> /commit -> the
experiences (tokens, logprobs, rewards) in the durable store, one per response -> a new
checkpoint written the way the trainer writes it is picked up without a restart (model_version 1,
greedy output changes) -> the engine that did so ran the executor chosen for it (by default vLLM's
worker process beside the EngineCore, as upstream; RFTSTACK_ENGINE_EXECUTOR=uni: the uni executor) -> nothing listens outside loopback -> SIGINT leaves no process and gives
the GPU memory back.

One serve for the module (engine start is minutes); the tests run in file order.
Run on the GPU host:  python3 -m pytest -v tests/gpu/test_rl_loop_gpu.py
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import ServeRun, rftstack_env
from gpu_helpers import cmdline, gpu_memory_used_mib, gpu_pids, has_gpu, memory_back_after, parent_pid, post, write_trainer_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


class Served:
    def __init__(self, run: ServeRun, ready: dict, baseline_mib: int):
        self.run = run
        self.ready = ready
        self.endpoint = ready["endpoint"]
        self.base = self.endpoint[: -len("/v1")]
        self.baseline_mib = baseline_mib
        self.response_ids: list[str] = []
        from openai import OpenAI

        self.client = OpenAI(base_url=self.endpoint, api_key="unused", max_retries=0, timeout=120)
        self.model = self.client.models.list().data[0].id
        self.config = yaml.safe_load((run.run_dir / "config.yaml").read_text())

    def metrics(self) -> dict:
        return json.loads(urllib.request.urlopen(self.base + "/metrics", timeout=30).read())

    def chat(self, content: str, **kw) -> str:
        r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": content}], max_tokens=16, **kw)
        self.response_ids.append(r.id)
        return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from rftstack.run import report_config
    from rftstack.run import supervisor
    from rftstack.run import tinymodel

    tmp = tmp_path_factory.mktemp("rl")
    model = tinymodel.ensure(tmp / "cache" / "rftstack" / "tiny-model")
    cfg = report_config.write(tmp / "qwen3b.yaml", model, max_model_len=2048, temperature=0.0,
                              explorer={"service_status_check_interval": 5})
    baseline = gpu_memory_used_mib()
    run = ServeRun(["-c", str(cfg), "--num-gpus", "1"], rftstack_env(XDG_CACHE_HOME=str(tmp / "cache")), tmp, tmp / "run")
    try:
        ready = run.wait_event("ready", timeout=900)
        assert ready, (run.finish(), run.stderr_text()[-5000:])
        yield Served(run, ready, baseline)
    finally:
        run.kill()
        for tag in run.tags():
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)


def test_effective_config_keeps_weights_following_training(served):
    assert served.config["explorer"]["min_running_model_num"] == 0
    assert served.config["explorer"]["listen_address"] == "127.0.0.1"
    assert served.config["synchronizer"]["sync_method"] == "checkpoint"
    assert served.endpoint.startswith("http://127.0.0.1:")


def test_plain_chat_completions(served):
    outs = [served.chat(f"hello {i}") for i in range(3)]
    assert all(isinstance(o, str) for o in outs)
    r = served.client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": "x"}], max_tokens=8)
    served.response_ids.append(r.id)
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0


def test_streamed_chat_completion(served):
    stream = served.client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "stream please"}], max_tokens=16, stream=True
    )
    ids, text, chunks = set(), "", 0
    for chunk in stream:
        chunks += 1
        ids.add(chunk.id)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert chunks > 1 and len(ids) == 1
    served.response_ids.append(ids.pop())


def test_chat_completion_with_tools(served):
    r = served.client.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "weather in Paris?"}], max_tokens=16,
        tools=TOOLS, tool_choice="none",
    )
    served.response_ids.append(r.id)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_sixteen_concurrent_clients(served):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: served.chat(f"concurrent {i}"), range(16)))
    assert len(outs) == 16


def test_feedback_commit_and_durable_experiences(served):
    ids = list(served.response_ids)
    assert len(ids) == len(set(ids)) == 3 + 1 + 1 + 1 + 16
    half = len(ids) // 2
    assert post(served.base + "/feedback", {"reward": 1.0, "msg_ids": ids[:half], "task_id": "t1", "run_id": 0})["status"] == "success"
    assert post(served.base + "/feedback", {"reward": 0.25, "msg_ids": ids[half:], "task_id": "t2", "run_id": 0})["status"] == "success"
    assert post(served.base + "/commit", {})["status"] == "success"
    db = served.ready["data"]["experience_buffer"].removeprefix("sqlite:///")
    assert db.startswith(str(served.run.run_dir))
    rows = []
    for _ in range(30):  # the commit is written by trinity's buffer writer actor
        if Path(db).exists():
            con = sqlite3.connect(db)
            tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
            exp_tables = [t for t in tables if "reward" in [c[1] for c in con.execute(f'pragma table_info("{t}")')]]
            rows = [r for t in exp_tables for r in con.execute(f'select msg_id, reward from "{t}"')]
            con.close()
            if len(rows) >= len(ids):
                break
        time.sleep(1)
    assert len(rows) == len(ids), rows  # one per response, none lost, none doubled
    rewards = {m: r for m, r in rows}
    assert rewards == {**{i: 1.0 for i in ids[:half]}, **{i: 0.25 for i in ids[half:]}}
    m = served.metrics()
    assert m.get("rollout/total_experience_count", len(ids)) >= len(ids)


def test_experiences_carry_tokens_and_logprobs(served):
    from trinity.common.experience import Experience

    db = served.ready["data"]["experience_buffer"].removeprefix("sqlite:///")
    con = sqlite3.connect(db)
    blobs = []
    for (t,) in con.execute("select name from sqlite_master where type='table'"):
        cols = [c[1] for c in con.execute(f'pragma table_info("{t}")')]
        if "experience_bytes" in cols:
            blobs += [b for (b,) in con.execute(f'select experience_bytes from "{t}"')]
    con.close()
    assert len(blobs) >= 22
    for b in blobs:
        exp = Experience.deserialize(b)
        n_resp = len(exp.tokens) - exp.prompt_length
        assert exp.prompt_length > 0 and n_resp > 0
        assert len(exp.logprobs) == n_resp


def test_new_checkpoint_is_served_without_restart(served):
    from rftstack.run import serve_config

    before = [served.chat("hello world") for _ in range(2)]
    assert before[0] == before[1], "temperature 0 should be deterministic"
    assert served.metrics().get("rollout/model_0/model_version") == 0
    write_trainer_checkpoint(Path(served.config["model"]["model_path"]), Path(serve_config.job_dir(served.config)))
    t0, version = time.monotonic(), None
    while time.monotonic() - t0 < 120:
        version = served.metrics().get("rollout/model_0/model_version")
        if version == 1:
            break
        time.sleep(1)
    print(f"model_version 1 after {time.monotonic() - t0:.1f} s")
    assert version == 1
    after = served.chat("hello world")
    assert after != before[0]


def test_the_engine_ran_with_the_executor_the_patch_chose(served):
    """patches/trinity-engine-uni-executor.patch, on the engine that just served and reloaded weights:
    by default (mp, as upstream) the process on the GPU is vLLM's worker process, a child of the
    EngineCore; with RFTSTACK_ENGINE_EXECUTOR=uni in the serve's environment one GPU on one node runs
    vLLM's uni executor, the GPU worker inside the EngineCore process, whose parent is Trinity's engine
    actor (a Ray worker, `ray::...`). Prints the processes on the GPU and their parents either way."""
    from rftstack.run import supervisor

    ours = {p.pid for tag in served.run.tags() for p in supervisor.tagged(tag)}
    on_gpu = sorted(gpu_pids() & ours)
    chain = {pid: {"process": cmdline(pid), "parent": cmdline(parent_pid(pid))} for pid in on_gpu}
    mode = os.environ.get("RFTSTACK_ENGINE_EXECUTOR", "mp").strip()
    print(f"executor expected: {mode}; processes on the GPU: {chain}")
    assert len(on_gpu) == 1, chain
    parent = chain[on_gpu[0]]["parent"]
    if mode == "mp":
        assert not parent.startswith("ray::"), chain
    else:
        assert parent.startswith("ray::"), chain


def test_nothing_listens_outside_loopback(served):
    from rftstack.doctor import netstat
    from rftstack.run import supervisor

    by_inode = {l.inode: l for l in netstat.listeners()}
    socks = [(p.pid, p.cmdline[:80], by_inode[i]) for tag in served.run.tags() for p in supervisor.tagged(tag)
             for i in netstat.socket_inodes(p.pid) if i in by_inode]  # fmt: skip
    print(f"{len(socks)} listening sockets in the serve's process tree")
    assert socks
    outside = [(pid, cmd, l.address, l.port) for pid, cmd, l in socks if not l.loopback]
    assert outside == [], outside


def test_ray_token_in_no_log_and_no_file_name(served):
    """The head's token (run/ray-head/auth_token) appears in no other file of the run directory
    (Trinity's, vLLM's and Ray's real logs, the Ray session through the run's `ray` link) nor in
    any file name there."""
    run_dir = served.run.run_dir
    token_file = run_dir / "ray-head" / "auth_token"
    token = token_file.read_text().strip()
    assert len(token) >= 16
    scanned, hits = 0, []
    for root, dirs, files in os.walk(run_dir, followlinks=True):
        for name in dirs + files:
            assert token not in name
        for name in files:
            path = Path(root) / name
            if path == token_file or not path.is_file() or path.stat().st_size > 64 * 2**20:
                continue
            scanned += 1
            if token.encode() in path.read_bytes():
                hits.append(str(path))
    print(f"token searched in {scanned} files of the run directory and its Ray session")
    assert scanned > 10 and hits == []


def test_sigint_stops_everything_and_frees_the_gpu(served):
    from rftstack.run import supervisor

    tags = served.run.tags()
    ours = {p.pid for tag in tags for p in supervisor.tagged(tag)}
    assert gpu_pids() & ours
    served.run.proc.send_signal(signal.SIGINT)
    assert served.run.finish(timeout=300) == 0, served.run.stderr_text()[-5000:]
    assert all(supervisor.tagged(tag) == [] for tag in tags)
    assert not (gpu_pids() & ours)
    assert memory_back_after(served.baseline_mib, 30) is not None
    status = json.loads((served.run.run_dir / "status.json").read_text())
    assert status["phase"] == "stopped"
    # the committed experiences survive the stop
    db = served.ready["data"]["experience_buffer"].removeprefix("sqlite:///")
    con = sqlite3.connect(db)
    n = sum(con.execute(f'select count(*) from "{t}"').fetchone()[0]
            for (t,) in con.execute("select name from sqlite_master where type='table'")
            if "reward" in [c[1] for c in con.execute(f'pragma table_info("{t}")')])
    con.close()
    assert n >= 22
