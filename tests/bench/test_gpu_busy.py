"""bench/gpu_busy.py: the GPU's busy share over a measured window, from NVML. This machine has no GPU and no
driver, so the real pynvml shows the unavailable path, and a TEST DOUBLE of NVML (a GPU cannot exist here) gives
the samples a driver would."""

from __future__ import annotations

import time

import gpu_busy  # bench/
import pytest
from nvml_double import DoubleNvml


def sample(nvml, seconds=0.3, **stop) -> dict:
    s = gpu_busy.Sampler(period_s=0.01, nvml=nvml)
    s.start()
    time.sleep(seconds)
    return s.stop(**stop)


def test_busy_share_and_ms_a_response_and_a_step():
    nvml = DoubleNvml([[100, 0]] * 5 + [[50, 0]])  # two GPUs: the busier one counts
    gpu = sample(nvml, responses=600, wall_s=3.0)
    assert gpu["devices"] == 2 and gpu["samples"] >= 10 and nvml.shut and "error" not in gpu
    want = (5 * 100 + (gpu["samples"] - 5) * 50) / gpu["samples"]
    assert gpu["busy_pct"] == pytest.approx(want, abs=0.05)
    assert gpu["busy_ms_per_response"] == pytest.approx(gpu["busy_pct"] / 100 * 3000 / 600, abs=0.001)
    gpu["busy_ms_per_step"] = gpu_busy.per_step(gpu, steps_per_s=200.0)
    assert gpu["busy_ms_per_step"] == pytest.approx(gpu["busy_pct"] / 100 * 5.0, abs=0.001)
    assert gpu_busy.line(gpu) == (f"gpu: {gpu['busy_pct']} % busy ({gpu['samples']} samples), "
                                  f"{gpu['busy_ms_per_response']} ms a response, {gpu['busy_ms_per_step']} ms a step")


def test_without_nvml_the_window_says_why():
    gpu = sample(DoubleNvml([[0]], fail_init=OSError("libnvidia-ml.so.1: cannot open shared object file")), 0.05)
    assert gpu == {"devices": 0, "samples": 0, "period_s": 0.01,
                   "error": "NVML unavailable: OSError: libnvidia-ml.so.1: cannot open shared object file"}
    assert gpu_busy.line(gpu) == f"gpu: {gpu['error']}" and gpu_busy.per_step(gpu, 200.0) is None


def test_the_real_pynvml_without_a_driver():
    """The library the stack installs, on a machine with no NVIDIA driver (this one and CI's)."""
    gpu = sample(None, 0.05, responses=10, wall_s=0.05)
    assert gpu["samples"] == 0 and gpu["error"].startswith("NVML unavailable: ")
    assert "busy_pct" not in gpu and "busy_ms_per_response" not in gpu


def test_a_gpu_lost_mid_window_keeps_the_samples_before():
    gpu = sample(DoubleNvml([[80]], fail_after=4), 0.2, responses=100, wall_s=0.2)
    assert gpu["samples"] == 4 and gpu["busy_pct"] == 80.0
    assert gpu["error"] == "NVML stopped answering: RuntimeError: GPU is lost"
