"""What vLLM's own Prometheus metrics (``/metrics`` of ``vllm serve``) say about a measured window.

The load generator sees responses; the engine's metrics say how it spent the window: how many engine
steps it ran and how many tokens each carried (``vllm:iteration_tokens_total``), how many requests were
running (``vllm:num_requests_running``, sampled through the window) and, per finished request, the time
from arrival to the end in the frontend (``e2e_request_latency``) against the time the engine had it
scheduled (``request_inference_time``) and waiting in its queue (``request_queue_time``). With closed
loops, a frontend that is slow to answer and to admit shows as fewer running requests than clients while
each step takes as long as before; an engine that is slower per step shows as fewer steps per second
with the batch full.

    a = scrape(url); ...window...; b = scrape(url); window(a, b, wall_s, running=[...])
"""

from __future__ import annotations

import statistics
import time
import urllib.request

# histograms whose mean per finished request the window reports (seconds)
REQUEST_TIMES = ("e2e_request_latency_seconds", "request_inference_time_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds")


def parse(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets} (``vllm:`` dropped).
    Comment lines are skipped; a histogram's buckets are left out (its _sum and _count are kept)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name.endswith("_bucket") or not name_labels:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        key = name[len("vllm:"):] if name.startswith("vllm:") else name
        out[key] = out.get(key, 0.0) + v
    return out


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as r:
        return parse(r.read().decode("utf-8", "replace"))


def keeps_stats(base_url: str) -> bool:
    """Whether the server at ``base_url`` serves vLLM's engine statistics on /metrics: `vllm serve` by default;
    Trinity's engine only with RFTSTACK_ENGINE_LOG_STATS=1 (patches/trinity-engine-log-stats.patch), since
    Trinity builds it with disable_log_stats=True and its /metrics then has only the HTTP server's own."""
    try:
        return "iteration_tokens_total_count" in scrape(base_url)
    except OSError:
        return False


def sample_running(base_url: str, seconds: float, every_s: float = 0.25) -> list[float]:
    """``num_requests_running`` every ``every_s`` for ``seconds`` (what is left of a window after a scrape)."""
    end = time.monotonic() + seconds
    xs: list[float] = []
    while True:
        try:
            xs.append(scrape(base_url).get("num_requests_running", 0.0))
        except OSError:
            pass
        left = end - time.monotonic()
        if left <= 0:
            return xs
        time.sleep(min(every_s, left))


def window(a: dict[str, float], b: dict[str, float], wall_s: float, running: list[float] | None = None) -> dict:
    """The engine's account of a window between scrapes ``a`` and ``b``: steps/s, tokens per step, the mean
    of the sampled running requests and, per request finished in it, the mean of each of REQUEST_TIMES."""
    def d(name: str) -> float:
        return b.get(name, 0.0) - a.get(name, 0.0)
    steps = d("iteration_tokens_total_count")
    out: dict = {"steps_per_s": round(steps / wall_s, 2) if wall_s > 0 else None,
                 "tokens_per_step": round(d("iteration_tokens_total_sum") / steps, 2) if steps else None,
                 "generation_tokens_per_s": round(d("generation_tokens_total") / wall_s, 1) if wall_s > 0 else None,
                 "running_mean": round(statistics.fmean(running), 2) if running else None,
                 "running_samples": len(running or [])}
    finished = d("e2e_request_latency_seconds_count")
    out["finished"] = int(finished)
    out["mean_s"] = {k.removesuffix("_seconds"): (round(d(f"{k}_sum") / d(f"{k}_count"), 4) if d(f"{k}_count") else None)
                     for k in REQUEST_TIMES}
    return out


def during_window(base_url: str, seconds: float) -> dict:
    """A measured window's ``during`` (bench/serve_profile.py): scrape, sample the running requests for
    ``seconds``, scrape again; the engine's account, or why there is none."""
    try:
        a = scrape(base_url)
    except OSError as exc:
        time.sleep(seconds)
        return {"error": f"no /metrics at {base_url}: {exc}"}
    t0 = time.monotonic()
    running = sample_running(base_url, seconds)
    try:
        b = scrape(base_url)
    except OSError as exc:
        return {"error": f"/metrics failed at the end of the window: {exc}"}
    return window(a, b, time.monotonic() - t0, running)
