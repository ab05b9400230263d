"""bench/loadgen.py against a TEST DOUBLE OpenAI server on loopback (vLLM needs a GPU)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
import loadgen  # noqa: E402
from openai_double import MODEL_ID, OpenAIDouble  # noqa: E402


def run_loadgen(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench/loadgen.py"), *args], capture_output=True, text=True, timeout=timeout)


def test_percentile_matches_numpy():
    import numpy as np

    xs = [0.3, 0.1, 0.7, 0.2, 0.9, 0.5, 0.4]
    for q in (0, 50, 90, 99, 100):
        assert loadgen.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert loadgen.percentile([], 50) is None
    assert loadgen.percentile([2.0], 99) == 2.0


def test_prompts_are_deterministic_and_distinct():
    a, b = loadgen.prompts(16), loadgen.prompts(16)
    assert a == b and len(set(a)) == 16
    assert loadgen.prompts(4, seed=1) != loadgen.prompts(4, seed=0)


def test_counts_tokens_errors_and_short_outputs(tmp_path):
    # request k fails when k % 5 == 0, and is one token short when k % 7 == 0 (and not failing)
    out = tmp_path / "r.json"
    with OpenAIDouble(fail_every=5, short_every=7) as srv:
        r = run_loadgen("--base-url", srv.base_url, "--concurrency", "1,4", "--requests", "20",
                        "--max-tokens", "7", "--warmup", "0", "--label", "double", "--out", str(out))
        bodies = list(srv.bodies)
    assert r.returncode == 3, r.stderr  # errors happened: non-zero
    res = json.loads(out.read_text())
    assert res["model"] == MODEL_ID and res["label"] == "double"
    l1, l4 = res["levels"]
    # level 1: requests 1..20 -> failures 5,10,15,20; short 7,14
    assert (l1["concurrency"], l1["requests"], l1["ok"], l1["errors"]) == (1, 20, 16, 4)
    assert l1["error_kinds"] == {"http_500": 4}
    assert l1["short_outputs"] == 2 and l1["output_tokens"] == 16 * 7 - 2
    # level 4: requests 21..40 -> failures 25,30,35,40; short 21,28 (35 fails)
    assert (l4["concurrency"], l4["ok"], l4["errors"], l4["short_outputs"]) == (4, 16, 4, 2)
    assert l4["output_tokens"] == 16 * 7 - 2
    for lv in (l1, l4):
        assert lv["output_tokens_per_s"] == pytest.approx(lv["output_tokens"] / lv["wall_s"], rel=1e-3)
        lat = lv["latency_s"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert not lv["truncated"]
        # the machine's CPU over the level, from /proc/stat (steal: what the hypervisor took; a level this short
        # is a few clock ticks, so only the fields are checked here, their sums in test_bench_serve_profile.py)
        m = lv["machine"]
        assert m["cpus"] == os.cpu_count() and min(m["busy_cores"], m["idle_cores"], m["steal_cores"]) >= 0
    assert len(bodies) == 40
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 7 and b["model"] == MODEL_ID for b in bodies)
    assert not any("logprobs" in b for b in bodies)


def test_like_proxy_sends_what_trinitys_proxy_adds(tmp_path):
    with OpenAIDouble() as srv:
        r = run_loadgen("--base-url", srv.base_url, "--concurrency", "2", "--requests", "4", "--max-tokens", "3",
                        "--like-proxy", "--temperature", "0.5", "--json")
        bodies = list(srv.bodies)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["levels"][0]["ok"] == 4
    assert len(bodies) == 4 + 2  # two warm-up requests by default
    assert all(b["logprobs"] is True and b["return_token_ids"] is True and b["temperature"] == 0.5 for b in bodies)
    assert not any("vllm_xargs" in b for b in bodies)


def test_like_proxy_numeric_adds_the_numeric_mark():
    import loadgen

    body = loadgen.request_body("m", "p", 4, temperature=1.0, like_proxy=loadgen.NUMERIC)
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert body["vllm_xargs"] == {"rftstack_logprobs_numeric": 1}
    assert "vllm_xargs" not in loadgen.request_body("m", "p", 4, temperature=1.0, like_proxy=True)


def test_level_time_limit_truncates():
    with OpenAIDouble(delay_s=0.2) as srv:
        r = run_loadgen("--base-url", srv.base_url, "--concurrency", "2", "--requests", "500", "--max-tokens", "2",
                        "--warmup", "0", "--level-timeout", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    lv = json.loads(r.stdout)["levels"][0]
    assert lv["truncated"] and 0 < lv["requests"] < 500 and lv["errors"] == 0


def test_unreachable_server_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_loadgen("--base-url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--requests", "1")
    assert r.returncode == 1
    assert "cannot reach" in r.stderr or "failed" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_concurrency_list():
    r = run_loadgen("--base-url", "http://127.0.0.1:9", "--concurrency", "1,x")
    assert r.returncode != 0 and "comma list" in r.stderr and "Traceback" not in r.stderr


def test_spread_lengths_are_seeded_bounded_and_checked_per_request(tmp_path):
    draws = [loadgen.max_tokens_for(i, 64, 0.75) for i in range(400)]
    assert draws == [loadgen.max_tokens_for(i, 64, 0.75) for i in range(400)]  # same on every path
    assert min(draws) >= 16 and max(draws) <= 112 and len(set(draws)) > 50
    assert 56 <= sum(draws) / len(draws) <= 72
    assert {loadgen.max_tokens_for(i, 64, 0) for i in range(50)} == {64}
    out = tmp_path / "r.json"
    with OpenAIDouble(short_every=7) as srv:
        r = run_loadgen("--base-url", srv.base_url, "--concurrency", "4", "--requests", "20", "--max-tokens", "8",
                        "--max-tokens-spread", "0.5", "--warmup", "0", "--out", str(out))
        bodies = list(srv.bodies)
    assert r.returncode == 0, r.stderr
    lv = json.loads(out.read_text())["levels"][0]
    asked = sorted(b["max_tokens"] for b in bodies)
    assert asked == sorted(loadgen.max_tokens_for(i, 8, 0.5) for i in range(20)) and len(set(asked)) > 1
    # short only where the double answered one token less than that request asked (requests 7 and 14)
    assert lv["short_outputs"] == 2 and lv["output_tokens"] == sum(asked) - 2
    assert json.loads(out.read_text())["params"]["max_tokens_spread"] == 0.5


def test_bad_spread_is_one_sentence():
    r = run_loadgen("--base-url", "http://127.0.0.1:9", "--max-tokens-spread", "1.5")
    assert r.returncode == 2 and "--max-tokens-spread 1.5 must be at least 0 and below 1" in r.stderr


def _rec(t_start: float, t_end: float, tokens: int | None, ok: bool = True) -> dict:
    return {"ok": ok, "latency_s": t_end - t_start, "completion_tokens": tokens, "error": None if ok else "http_500",
            "t_start": t_start, "t_end": t_end, "max_tokens": 100}


def test_steady_window_leaves_out_ramp_up_and_drain():
    """C = 2. Ramp-up: r0 and r1 start at 0 and end at 1.0 and 2.0, so t_a = 2.0 (two requests ended);
    the latest start is r7's at 4.5 = t_b. In (2.0, 4.5]: r2 (10 tokens at 3.0), r3 (failed at 3.5, not
    counted), r4 (10 at 4.0), r5 (10 at 4.5, the closed end). r1 ends at t_a (open end) and r6, r7
    after t_b (the drain). 30 tokens / 2.5 s = 12 tok/s, 3 requests / 2.5 s = 1.2 req/s,
    2.5 s of the 6.0 s wall. With the ramp-up's 200 tokens or the drain's 110 the figure would differ."""
    records = [
        _rec(0.0, 1.0, 100), _rec(0.0, 2.0, 100),  # the first wave
        _rec(1.0, 3.0, 10), _rec(2.0, 3.5, None, ok=False), _rec(3.0, 4.0, 10), _rec(3.5, 4.5, 10),
        _rec(4.0, 5.0, 10), _rec(4.5, 6.0, 100),  # r7 starts last; r6 and r7 end in the drain
    ]
    s = loadgen.summarise(records[::-1], 6.0, concurrency=2, max_tokens=100, truncated=False)
    assert s["steady"] == {"output_tokens_per_s": 12.0, "requests_per_s": 1.2, "window_s": 2.5, "from_s": 2.0,
                           "to_s": 4.5, "requests": 3, "output_tokens": 30, "share_of_wall": 0.4167}
    # the whole-wall figures are unchanged: (100 + 100 + 10 * 4 + 100) / 6.0
    assert s["output_tokens"] == 340 and s["output_tokens_per_s"] == round(340 / 6.0, 2) and s["ok"] == 7


@pytest.mark.parametrize("records, reason", [
    ([], "no request times"),
    ([{"ok": True, "latency_s": 1.0, "completion_tokens": 5, "error": None}] * 4, "no request times"),
    ([_rec(0.0, 1.0, 5)], "fewer than 2 requests"),
    # four requests all started at 0: the last start precedes the second end
    ([_rec(0.0, 1.0 + i, 5) for i in range(4)], "no window: the last request started before the first wave ended"),
    # t_a = 1.1 (second end), t_b = 1.4 (last start): 0.3 s
    ([_rec(0.0, 1.0, 5), _rec(0.0, 1.1, 5), _rec(1.0, 1.3, 5), _rec(1.1, 1.35, 5), _rec(1.4, 2.0, 5)],
     "window shorter than 0.5 s"),
    # t_a = 1.1, t_b = 3.0: 1.9 s, but only one request ends in it
    ([_rec(0.0, 1.0, 5), _rec(0.0, 1.1, 5), _rec(1.0, 2.0, 5), _rec(1.1, 4.0, 5), _rec(3.0, 4.5, 5)],
     "fewer than 2 completions in the window"),
    # the same window with two ends in it, one of them failed
    ([_rec(0.0, 1.0, 5), _rec(0.0, 1.1, 5), _rec(1.0, 2.0, 5), _rec(1.1, 2.5, None, ok=False), _rec(3.0, 4.5, 5)],
     "fewer than 2 completions in the window"),
])
def test_steady_window_empty_or_short_is_null_with_a_reason(records, reason):
    s = loadgen.summarise(records, 5.0, concurrency=2, max_tokens=5, truncated=False)
    assert s["steady"] == {"output_tokens_per_s": None, "reason": reason}


def test_steady_window_of_a_level_against_the_double():
    """A real level (aiohttp client, loopback HTTP): 4 clients, 80 requests of 50 ms each, about 1 s;
    the steady window is its middle, without the first wave and the drain; the progress line ends
    with the steady figure and the machine's steal over the level."""
    lines: list[str] = []
    with OpenAIDouble(delay_s=0.05) as srv:
        res = asyncio.run(loadgen.run(srv.base_url, levels=[4], requests=80, max_tokens=6, label="double",
                                      warmup=0, progress=lines.append))
    lv = res["levels"][0]
    st = lv["steady"]
    assert lv["ok"] == 80 and lv["errors"] == 0
    assert st["output_tokens_per_s"] > 0 and 0.5 <= st["window_s"] < lv["wall_s"]
    assert 0 < st["share_of_wall"] < 1 and st["share_of_wall"] == pytest.approx(st["window_s"] / lv["wall_s"], abs=1e-3)
    assert 4 <= st["requests"] < 80 and st["output_tokens"] == 6 * st["requests"]
    assert st["output_tokens_per_s"] == pytest.approx(st["output_tokens"] / st["window_s"], rel=1e-3)
    assert 0 < st["from_s"] < st["to_s"] < lv["wall_s"]
    assert "t_start" not in json.dumps(res) and "t_end" not in json.dumps(res)  # no per-request lists
    assert lines == [f"[loadgen double] c=4: 80/80 ok, {lv['output_tokens_per_s']} tok/s, p50 {lv['latency_s']['p50']} s, "
                     f"p99 {lv['latency_s']['p99']} s, steady {st['output_tokens_per_s']} tok/s, "
                     f"steal {lv['machine']['steal_cores']} cores"]


def test_each_level_records_the_gpu_when_asked(monkeypatch):
    """loadgen.run(gpu=True) (serve_vs_bare.py's long runs; loadgen.py --gpu-busy): each level's ``gpu`` from
    bench/gpu_busy.py, on its progress line too. No GPU here: the real pynvml first (its one phrase why), then a
    TEST DOUBLE of NVML (a GPU always 60 % busy) for the arithmetic; without the option no ``gpu`` at all."""
    import gpu_busy
    from nvml_double import DoubleNvml

    lines: list[str] = []
    with OpenAIDouble(delay_s=0.02) as srv:
        plain = asyncio.run(loadgen.run(srv.base_url, levels=[2], requests=10, max_tokens=4, warmup=0))
        real = asyncio.run(loadgen.run(srv.base_url, levels=[2], requests=10, max_tokens=4, warmup=0, gpu=True,
                                       label="r", progress=lines.append))
        monkeypatch.setattr(gpu_busy, "load_nvml", lambda: DoubleNvml([[60]]))
        double = asyncio.run(loadgen.run(srv.base_url, levels=[2], requests=40, max_tokens=4, warmup=0, gpu=True))
    assert "gpu" not in plain["levels"][0]
    g = real["levels"][0]["gpu"]
    assert g["error"].startswith("NVML unavailable: ") and lines[0].endswith(f", gpu: {g['error']}")
    lv = double["levels"][0]
    g = lv["gpu"]
    assert g["samples"] >= 1 and g["busy_pct"] == 60.0 and "error" not in g
    assert g["busy_ms_per_response"] == pytest.approx(0.6 * lv["wall_s"] * 1000 / 40, rel=0.05)


def test_double_answers_longer_completions_later(tmp_path):
    """openai_double.py --delay-per-token-s, started as proxy_overhead.py --upstream-delay-per-token-s starts it: sent at
    the same moment, an answer of 25 tokens comes 0.5 s or more after the request, one of 1 token before it."""
    import threading
    import time
    import urllib.request

    import proxy_overhead as po

    double, url = po.start_double(tmp_path, per_token_s=0.02)
    try:
        took: dict[int, float] = {}

        def ask(n: int) -> None:
            body = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": n})
            req = urllib.request.Request(f"{url}/v1/chat/completions", body.encode(), {"Content-Type": "application/json"})
            t0 = time.monotonic()
            with urllib.request.urlopen(req, timeout=30) as r:
                assert json.loads(r.read())["usage"]["completion_tokens"] == n
            took[n] = time.monotonic() - t0

        threads = [threading.Thread(target=ask, args=(n,)) for n in (25, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        po.stop(double)
    assert took[25] >= 0.5 and took[1] < took[25]


def test_double_refuses_a_negative_delay():
    r = subprocess.run([sys.executable, str(REPO / "bench/openai_double.py"), "--delay-per-token-s", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--delay-per-token-s take seconds, 0 or more" in r.stderr and "URL" not in r.stdout
