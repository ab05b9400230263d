"""TEST DOUBLE of NVML (pynvml's calls bench/gpu_busy.py makes): a GPU cannot exist on the CPU machine."""

from __future__ import annotations

import threading
from types import SimpleNamespace


class DoubleNvml:
    """TEST DOUBLE of pynvml's calls the sampler makes: ``gpus`` devices whose utilisation walks through ``values``
    (one per device per poll, repeating the last), and an init that fails when told to."""

    def __init__(self, values: list[list[float]], fail_init: Exception | None = None, fail_after: int | None = None):
        self.values, self.fail_init, self.fail_after = values, fail_init, fail_after
        self.polls, self.shut = 0, False
        self.lock = threading.Lock()

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlDeviceGetCount(self):
        return len(self.values[0])

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        with self.lock:
            if self.fail_after is not None and self.polls >= self.fail_after:
                raise RuntimeError("GPU is lost")
            row = self.values[min(self.polls // self.nvmlDeviceGetCount(), len(self.values) - 1)]
            self.polls += 1
        return SimpleNamespace(gpu=row[handle], memory=0)

    def nvmlShutdown(self):
        self.shut = True
