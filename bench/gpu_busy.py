"""How busy the GPU was during a measured window, from NVML (the driver's library, through nvidia-ml-py's
``pynvml``, which the stack installs with vLLM).

Session AN found the serve's vLLM worker waiting longer for the GPU a response than bare's with the same arguments
and request (docs/benchmarks.md section 1, session AN). Whether the GPU then works longer a step in the serve, or
sits idle longer between steps, is what this tells, beside the engine's own step rate:

    sampler = gpu_busy.Sampler()      # polls every GPU's utilisation every 50 ms in a thread of its own
    sampler.start()
    ...                               # the window
    gpu = sampler.stop(responses=1300, wall_s=12.0)
    # {"devices": 1, "samples": 240, "busy_pct": 87.4, "busy_ms_per_response": 8.07}

NVML's utilisation is the share of its own sample period in which at least one kernel ran on the GPU, so a busy
share near 100 % says the GPU was the bound and less says it waited for the host. Where NVML cannot be loaded (no
driver, as on the CPU machine) ``stop`` says so in one phrase under ``error`` and the window goes on without it.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any


def load_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


class Sampler:
    def __init__(self, period_s: float = 0.05, nvml: Any = None):
        self.period_s = period_s
        self.nvml = nvml
        self.error: str | None = None
        self.handles: list = []
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            nvml = self.nvml = self.nvml or load_nvml()
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as e:  # ImportError, or pynvml's NVMLError_* (no driver, no library)
            self.error = f"NVML unavailable: {type(e).__name__}: {e}".strip().rstrip(":")
            return
        self._thread = threading.Thread(target=self._run, name="gpu-busy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:  # the busiest GPU: one in the benchmarks; with several, the one vLLM runs on
                self.samples.append(max(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles))
            except Exception as e:
                self.error = f"NVML stopped answering: {type(e).__name__}: {e}"
                return
            self._stop.wait(self.period_s)

    def stop(self, responses: int | None = None, wall_s: float | None = None) -> dict:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        out: dict = {"devices": len(self.handles), "samples": len(self.samples), "period_s": self.period_s}
        if self.error:
            out["error"] = self.error
        if not self.samples:
            out.setdefault("error", "NVML gave no sample in the window")
            return out
        out["busy_pct"] = round(statistics.fmean(self.samples), 1)
        if responses and wall_s:
            out["busy_ms_per_response"] = round(out["busy_pct"] / 100 * wall_s * 1000 / responses, 3)
        return out


def per_step(gpu: dict, steps_per_s: float | None) -> float | None:
    """GPU-busy ms an engine step (vLLM's own step rate over the same window), or None."""
    if "busy_pct" not in gpu or not steps_per_s:
        return None
    return round(gpu["busy_pct"] / 100 * 1000 / steps_per_s, 3)


def line(gpu: dict) -> str:
    """One phrase for a window's log line."""
    if "busy_pct" not in gpu:
        return f"gpu: {gpu.get('error', 'not sampled')}"
    said = f"gpu: {gpu['busy_pct']} % busy ({gpu['samples']} samples)"
    if "busy_ms_per_response" in gpu:
        said += f", {gpu['busy_ms_per_response']} ms a response"
    if gpu.get("busy_ms_per_step") is not None:
        said += f", {gpu['busy_ms_per_step']} ms a step"
    return said
