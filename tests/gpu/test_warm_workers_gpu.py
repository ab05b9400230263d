"""GPU host: serve's warm Ray workers (rftstack.run.warm_workers) import Trinity's actor modules
before Ray gives them a task; that import must not initialise CUDA, or a worker would keep the GPU
view it had then instead of the CUDA_VISIBLE_DEVICES Ray sets when it hands it an actor with GPUs.

Checked on a real head started as serve starts its own (the patched Ray's prestart count, the real
module list): an actor asking for one GPU runs in a warm worker (started before the driver, the
modules imported) and sees exactly the GPU Ray gave it, with CUDA initialised only by its own call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpu_helpers import has_gpu
from rftstack.run import ray_head
from rftstack.run import warm_workers

pytestmark = pytest.mark.skipif(not has_gpu(), reason="needs an NVIDIA GPU")

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import ray
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    connected = time.time()

    @ray.remote(num_gpus=1)
    class Probe:
        def report(self, modules):
            import torch
            before = torch.cuda.is_initialized()
            preloaded = [m for m in modules.split(",") if m in sys.modules]
            count = torch.cuda.device_count()
            torch.zeros(1, device="cuda")
            ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
            uptime = float(open("/proc/uptime").read().split()[0])
            return {"cuda_initialised_before": before, "preloaded": preloaded, "device_count": count,
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_ids": ray.get_gpu_ids(),
                    "process_started": time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")}

    print("REPORT " + json.dumps({"connected": connected, **ray.get(Probe.remote().report.remote(sys.argv[1]))}), flush=True)
""")


def test_a_gpu_actor_in_a_warm_worker_sees_the_gpu_ray_gave_it(tmp_path):
    trinity = {"TRINITY_LOG_DIR": str(tmp_path / "log")}
    env = {**os.environ, **warm_workers.head_env(trinity, 2)}
    head = ray_head.start(state_dir=tmp_path / "head", num_gpus=1, env=env, dashboard=False)
    try:
        time.sleep(45)  # the warm workers import torch, vLLM and Trinity, as while `trinity run` starts
        out = subprocess.run([sys.executable, "-c", DRIVER, ",".join(warm_workers.PRELOAD)], env=ray_head.driver_env(head),
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        lines = [l for l in out.stdout.splitlines() if l.startswith("REPORT ")]
        assert lines, out.stderr[-4000:]
        got = json.loads(lines[0][len("REPORT "):])
        print(json.dumps(got, indent=1))
        assert got["process_started"] < got["connected"], "the actor did not run in a warm worker"
        assert got["preloaded"] == list(warm_workers.PRELOAD)
        assert got["cuda_initialised_before"] is False
        assert got["device_count"] == 1 and got["visible"] == ",".join(str(int(i)) for i in got["gpu_ids"])
    finally:
        ray_head.stop(head, remove_temp=True)
