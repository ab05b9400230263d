"""bench/engine_metrics.py: the engine's account of a window, read from a real Prometheus exposition
(prometheus_client, the library vLLM's /metrics is served with, on a real HTTP port) whose metrics carry
the names the installed vLLM registers (checked against its source, so a rename upstream fails here).
The GPU host reads the same from bare `vllm serve` (bench/serve_profile.py --bare)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

import engine_metrics as em
import proxy_overhead as po
import serve_vs_bare as svb

REPO = Path(__file__).resolve().parents[2]
READ = ["iteration_tokens_total", "num_requests_running", "generation_tokens",
        *(n for n in em.REQUEST_TIMES)]


def test_the_names_read_are_the_installed_vllms():
    spec = importlib.util.find_spec("vllm")
    assert spec and spec.origin, "vllm is part of the locked stack"
    src = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    for name in READ:
        assert f'"vllm:{name}"' in src, f"vLLM no longer registers vllm:{name}"


@pytest.fixture
def engine():
    """A real Prometheus endpoint with vLLM's metric names, one model label set and one engine."""
    reg = CollectorRegistry()
    labels = {"model_name": "m", "engine": "0"}
    m = {
        "steps": Histogram("vllm:iteration_tokens_total", "tokens per step", list(labels), registry=reg,
                           buckets=(1, 8, 64, 512)),
        "running": Gauge("vllm:num_requests_running", "running", list(labels), registry=reg),
        "gen": Counter("vllm:generation_tokens", "generated", list(labels), registry=reg),
        **{n: Histogram(f"vllm:{n}", n, list(labels), registry=reg) for n in em.REQUEST_TIMES},
    }
    port = svb.free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield {k: v.labels(**labels) for k, v in m.items()}, f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_parse_sums_label_sets_and_drops_buckets():
    text = """# HELP vllm:num_requests_running x
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0"} 2.0
vllm:iteration_tokens_total_sum{engine="0"} 130.0
vllm:iteration_tokens_total_count{engine="0"} 3.0
process_cpu_seconds_total 1.5
garbage line without a number x
"""
    got = em.parse(text)
    assert got == {"num_requests_running": 7.0, "iteration_tokens_total_sum": 130.0,
                   "iteration_tokens_total_count": 3.0, "process_cpu_seconds_total": 1.5}


def test_a_window_is_the_engines_account_between_two_scrapes(engine):
    """Steps and their tokens, generated tokens and finished requests' times inside the window only; the
    running requests as sampled."""
    m, url = engine
    m["steps"].observe(999)  # before the window: left out
    m["e2e_request_latency_seconds"].observe(100.0)
    a = em.scrape(url)
    for tokens in (64, 64, 32):
        m["steps"].observe(tokens)
    m["gen"].inc(160)
    for e2e, inf in ((0.5, 0.3), (0.7, 0.5)):
        m["e2e_request_latency_seconds"].observe(e2e)
        m["request_inference_time_seconds"].observe(inf)
    b = em.scrape(url)
    w = em.window(a, b, 2.0, running=[64, 60, 62])
    assert w["steps_per_s"] == 1.5 and w["tokens_per_step"] == pytest.approx(160 / 3, abs=0.01)
    assert w["generation_tokens_per_s"] == 80.0 and w["running_mean"] == 62.0 and w["running_samples"] == 3
    assert w["finished"] == 2
    assert w["mean_s"]["e2e_request_latency"] == pytest.approx(0.6)
    assert w["mean_s"]["request_inference_time"] == pytest.approx(0.4)
    assert w["mean_s"]["request_queue_time"] is None  # none finished with one: no mean, not zero


def test_during_window_samples_the_gauge_while_it_moves(engine):
    m, url = engine
    m["running"].set(10)

    def later():
        time.sleep(0.5)
        m["running"].set(30)
        m["steps"].observe(30)
    t = threading.Thread(target=later)
    t.start()
    w = em.during_window(url, 1.0)
    t.join()
    assert w["running_samples"] >= 3 and 10 < w["running_mean"] < 30
    assert w["tokens_per_step"] == 30.0 and 0.5 < w["steps_per_s"] <= 1.1


def test_a_server_without_metrics_is_said_not_fatal(tmp_path):
    """The TEST DOUBLE upstream has no /metrics: the window still lasts its time and says why there is no account."""
    double, url = po.start_double(tmp_path)
    try:
        t0 = time.monotonic()
        w = em.during_window(url, 0.5)
        assert time.monotonic() - t0 >= 0.5
        assert w["error"].startswith(f"no /metrics at {url}")
    finally:
        po.stop(double)


def test_a_variants_environment_words_are_split_from_its_arguments():
    import serve_profile as sp
    words = sp.bare_args("VLLM_USE_RUST_FRONTEND=1 --distributed-executor-backend mp")
    assert sp.split_variant(words) == ({"VLLM_USE_RUST_FRONTEND": "1"}, ["--distributed-executor-backend", "mp"])
    assert sp.bare_args(" default ") == [] and sp.split_variant([]) == ({}, [])
    # an argument's value with '=' is an argument, not the environment
    assert sp.split_variant(["--override-generation-config={\"a\":1}"]) == ({}, ["--override-generation-config={\"a\":1}"])


@pytest.mark.parametrize("argv, says", [
    (["--no-serve"], "--no-serve leaves nothing to run; add --bare"),
    (["--bare-variants", "default;--api-server-count 2"], "--bare-variants needs --bare"),
    (["--bare", "--bare-variants", "default;;--api-server-count 2"], "names a variant twice"),
])
def test_serve_profile_bad_variants_are_one_sentence(tmp_path, argv, says):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "serve_profile.py"), "--model", str(tmp_path),
                        "--out", str(tmp_path / "o.json"), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


def test_keeps_stats_tells_vllms_statistics_from_an_http_servers_own(engine, tmp_path):
    """bare `vllm serve` (vLLM's metric names) keeps statistics; a /metrics with only the HTTP server's own (Trinity's
    engine as published: disable_log_stats=True) and a server with no /metrics (the TEST DOUBLE upstream) do not."""
    _, url = engine
    assert em.keeps_stats(url)
    reg = CollectorRegistry()
    Counter("http_requests", "the instrumentator's", registry=reg).inc()
    port = svb.free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    double, double_url = po.start_double(tmp_path)
    try:
        assert not em.keeps_stats(f"http://127.0.0.1:{port}")
        assert not em.keeps_stats(double_url)
    finally:
        po.stop(double)
        server.shutdown()
        thread.join(timeout=5)


def test_a_window_through_one_server_reads_the_engines_account_from_another(engine, tmp_path):
    """serve_profile's proxy windows with the engine's statistics on: the loop goes to one server (the proxy; here
    the TEST DOUBLE upstream, which has no /metrics) and the account comes from the engine's /metrics."""
    from types import SimpleNamespace

    import serve_profile as sp

    m, url = engine
    double, double_url = po.start_double(tmp_path)

    def steps():
        for _ in range(5):
            time.sleep(0.1)
            m["steps"].observe(16)
    t = threading.Thread(target=steps)
    try:
        t.start()
        w = sp.metered_loop(double_url, "double", 2, SimpleNamespace(max_tokens=4, warmup_s=0.0, window_s=1.0),
                            like_proxy=False, metrics_url=url)
        t.join()
        assert w["responses"] > 0 and "error" not in w["engine"]
        assert w["engine"]["tokens_per_step"] == 16.0 and w["engine"]["steps_per_s"] > 0
        assert "; engine: " in sp.summary_line(w) and " steps/s, 16.0 tokens/step" in sp.summary_line(w)
    finally:
        po.stop(double)
