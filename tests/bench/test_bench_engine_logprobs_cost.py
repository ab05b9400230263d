"""bench/engine_logprobs_cost.py: vLLM's own sampler, model-runner copy, scheduler slices and EngineCore -> frontend
messages for one step, with and without the sampled token's logprob, timed here on the CPU (the logits are a TEST
DOUBLE of the model's; the GPU host runs it with --device cuda)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "engine_logprobs_cost.py"


def cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


def test_every_stage_is_timed_and_the_logprobs_make_the_messages_larger(tmp_path):
    out = tmp_path / "not-yet" / "r.json"  # its folder is made (the GPU host's first step found none)
    r = subprocess.run([sys.executable, str(SCRIPT), "--batch", "4,16", "--steps", "20", "--vocab", "3000",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["batches"]) == {"4", "16"} and res["logprobs_mode"] == "processed_logprobs"
    for b in ("4", "16"):
        row = res["batches"][b]
        assert row["sampler, no logprobs"]["cpu_ms_per_step"] > 0
        assert "copy_to_host_cpu_ms_per_step" not in row["sampler, no logprobs"]
        assert row["sampler, sampled token's logprob"]["copy_to_host_cpu_ms_per_step"] > 0
        host = row["host side (ms per step)"]
        # each request's LogprobsLists (three arrays) is encoded and decoded beside its token: more work per step
        assert host["encode with logprobs"] > host["encode plain"] and host["decode with logprobs"] > host["decode plain"]
        assert host["scheduler slices"] > 0
    # the slices and messages grow with the batch
    small, big = (res["batches"][b]["host side (ms per step)"] for b in ("4", "16"))
    assert big["encode with logprobs"] > small["encode with logprobs"]
    assert "batch 16: sampler cpu" in r.stderr


@pytest.mark.parametrize("argv, says", [(["--batch", "0"], "--batch '0' is not a list of positive integers"),
                                        (["--batch", "a,b"], "is not a list of positive integers"),
                                        (["--steps", "0"], "--steps must be positive"),
                                        pytest.param(["--device", "cuda"], "torch sees no CUDA device here",
                                                     marks=pytest.mark.skipif(cuda_here(), reason="this machine has CUDA"))])
def test_bad_input_is_one_sentence(argv, says):
    r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
