"""Two Ray nodes on one GPU host: the head in a network namespace with no GPU (`--num-gpus 0`,
CUDA_VISIBLE_DEVICES empty), a worker holding the GPU in another; `rftstack serve --ray-address`
on the head with the user report's config on the tiny model.

Run on the GPU host as root (network namespaces), the stack installed for python3:
    PYTHONPATH=$PWD/python python3 -m pytest -q tests/gpu/test_cluster_gpu.py
Skipped without an NVIDIA GPU, without root or without `ip netns` (tests/gpu/ip_kit.sh makes a kit
of `ip` for a host without iproute2). Checks: the doctor sees the worker's GPU and driver and no CUDA
mismatch; serve gets ready; the vLLM engine's processes run in the worker's namespace and none in the
head's; Trinity's Explorer serves from the head (serve's log names RFTSTACK_EXPLORER_NODE, Trinity's
explorer_server_url.txt the head's address); a chat completion answers through the head's
proxy; a checkpoint written as the trainer writes it is served without a restart (model_version 1,
greedy answer changed: weight sync across the nodes); SIGINT stops serve (exit 0); stopping the
worker and the head leaves no process; GPU memory comes back. It prints one JSON line `CLUSTER_GPU {...}` with the timings and where things ran.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ServeRun, rftstack_env
from gpu_helpers import gpu_memory_used_mib, has_gpu, memory_back_after, write_trainer_checkpoint
from netns_helpers import PrivateNet, unavailable
from rftstack.run import report_config

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)


def titled(net, ns, prefix: bytes) -> list[int]:
    found = []
    for pid in net.pids(ns):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().startswith(prefix):
                found.append(pid)
        except OSError:
            pass
    return found


def test_head_without_gpu_worker_with_gpu_serve(tmp_path, tiny_model):
    why = unavailable()
    if why:
        pytest.skip(why)
    baseline = gpu_memory_used_mib()
    net = PrivateNet(2)
    temp_dirs: list[str] = []
    run = None
    try:
        (head_ns, head_ip), (worker_ns, worker_ip) = net.nodes
        env = rftstack_env(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))

        def cli(ns, *args, extra=None, timeout=600):
            return subprocess.run(net.cmd(ns, [sys.executable, "-m", "rftstack", *args]), env={**env, **(extra or {})},
                                  capture_output=True, text=True, timeout=timeout)  # fmt: skip

        t0 = time.monotonic()
        out = cli(head_ns, "ray-head", "--listen", head_ip, "--num-gpus", "0", "--state-dir", str(tmp_path / "head"), "--json",
                  extra={"CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        head = json.loads(out.stdout)
        temp_dirs.append(head["temp_dir"])
        token = tmp_path / "token"
        shutil.copy(head["token_path"], token)
        token.chmod(0o600)
        out = cli(worker_ns, "ray-worker", "--address", head["address"], "--token-file", str(token), "--num-gpus", "1",
                  "--state-dir", str(tmp_path / "worker"), "--json")  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        worker = json.loads(out.stdout)
        temp_dirs.append(worker["temp_dir"])
        t_cluster = time.monotonic() - t0

        # the report's config with model.temperature 0: Trinity's proxy samples at the config's
        # temperature, and the weight-sync check below compares greedy answers
        cfg = report_config.write(tmp_path / "qwen3b.yaml", tiny_model, max_model_len=2048, temperature=0.0,
                                  checkpoint_root_dir=tmp_path / "ckpt")  # fmt: skip
        out = cli(head_ns, "doctor", "--ray-address", head["address"], "--ray-token-path", head["token_path"], "-c", str(cfg),
                  "--skip", "config", "--json", extra={"CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
        found = {f["check"]: f for f in json.loads(out.stdout)["findings"]}
        assert found[f"cluster.node.{worker_ip}"]["status"] == "ok", found[f"cluster.node.{worker_ip}"]
        assert found["cluster.nodes"]["data"]["gpus_per_node"] == {head_ip: 0, worker_ip: 1}
        assert found["cluster.model_path"]["status"] == "ok"

        run = ServeRun(["--ray-address", head["address"], "--ray-token-path", head["token_path"], "-c", str(cfg), "--skip-doctor"],
                       {**env, "CUDA_VISIBLE_DEVICES": ""}, tmp_path, tmp_path / "run", prefix=net.cmd(head_ns, []))  # fmt: skip
        t1 = time.monotonic()
        ready = run.wait_event("ready", timeout=1200)
        assert ready, (run.finish(), run.stderr[-5000:])
        t_ready = time.monotonic() - t1
        assert titled(net, worker_ns, b"VLLM::") and not titled(net, head_ns, b"VLLM::")
        # Trinity's Explorer (the proxy) on the head: serve pins it there (trinity-explorer-node.patch)
        # and Trinity's explorer_server_url.txt names the head's address
        assert f"RFTSTACK_EXPLORER_NODE={head_ip}" in (tmp_path / "run" / "logs" / "serve.log").read_text()
        port = run.status()["proxy_port"]
        import yaml

        from rftstack.run import serve_config

        job = Path(serve_config.job_dir(yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())))
        # Trinity's state manager records where its service listens (the Explorer logs the same
        # line to its own file under the job dir, not to serve's trinity.log)
        assert (job / "explorer_server_url.txt").read_text().strip() == f"http://{head_ip}:{port}"

        def ask(path: str, body: dict | None = None) -> dict:
            """GET (or POST ``body`` to) the serve's proxy from inside the head's namespace."""
            script = (
                "import json, sys, urllib.request\n"
                f"url = 'http://127.0.0.1:{port}' + sys.argv[1]\n"
                "data = sys.argv[2].encode() if len(sys.argv) > 2 else None\n"
                "req = urllib.request.Request(url, data=data, headers={'Content-Type': 'application/json'})\n"
                "print(urllib.request.urlopen(req, timeout=120).read().decode())\n"
            )
            argv = [sys.executable, "-c", script, path] + ([json.dumps(body)] if body is not None else [])
            out = subprocess.run(net.cmd(head_ns, argv), capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, (path, out.stderr[-3000:])
            return json.loads(out.stdout)

        model = ask("/v1/models")["data"][0]["id"]

        def greedy() -> str:
            r = ask("/v1/chat/completions", {"model": model, "max_tokens": 16, "temperature": 0,
                                             "messages": [{"role": "user", "content": "hello world"}]})  # fmt: skip
            return r["choices"][0]["message"]["content"] or ""

        before = [greedy(), greedy()]
        assert before[0] == before[1], "temperature 0 should be deterministic"
        assert ask("/metrics").get("rollout/model_0/model_version") == 0
        # weight sync across the nodes: a checkpoint written as the trainer writes it (on the shared
        # file system both namespaces see), loaded by the engine on the worker without a restart
        write_trainer_checkpoint(tiny_model, job)
        t_sync, version = time.monotonic(), None
        while time.monotonic() - t_sync < 180 and version != 1:
            time.sleep(1)
            version = ask("/metrics").get("rollout/model_0/model_version")
        sync_s = time.monotonic() - t_sync
        assert version == 1, f"model_version {version} after {sync_s:.0f} s"
        assert greedy() != before[0], "the new weights did not change the greedy answer"
        run.proc.send_signal(signal.SIGINT)
        assert run.finish() == 0, run.stderr[-5000:]

        out = cli(worker_ns, "ray-worker", "stop", "--state-dir", str(tmp_path / "worker"), "--json")
        assert out.returncode == 0 and net.pids(worker_ns) == [], out.stdout + out.stderr
        out = cli(head_ns, "ray-head", "stop", "--state-dir", str(tmp_path / "head"), "--json")
        assert out.returncode == 0 and net.pids(head_ns) == [], out.stdout + out.stderr
        back = memory_back_after(baseline, 60)
        assert back is not None, "GPU memory did not come back within 60 s"
        print("CLUSTER_GPU " + json.dumps({"cluster_up_s": round(t_cluster, 1), "ready_s": round(t_ready, 1), "head": head_ip,
                                           "worker": worker_ip, "weight_sync_s": round(sync_s, 1), "memory_back_s": back}))  # fmt: skip
    finally:
        if run is not None:
            run.kill()
        net.destroy()
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)
