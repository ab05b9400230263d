"""bench/serve_vs_bare.py's pieces that run without a GPU: log markers (against vLLM's own message
formats), the Trinity config (through Trinity's own validation), readiness polling and process
teardown (against a TEST DOUBLE OpenAI server in a child process), and the summary ratios.
The GPU phases themselves run on the GPU host (bench/README.md)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from helpers import run_python

REPO = Path(__file__).resolve().parents[2]
import serve_vs_bare as svb  # noqa: E402

VLLM = Path(__import__("importlib").util.find_spec("vllm").origin).parent


@pytest.mark.parametrize("rel, fmt", [
    ("model_executor/model_loader/default_loader.py", '"Loading weights took %.2f seconds"'),
    ("v1/worker/gpu_model_runner.py", '"Model loading took %s GiB memory and %.6f seconds"'),
    ("compilation/backends.py", '"Dynamo bytecode transform time: %.2f s"'),
    ("compilation/backends.py", '"Compiling a graph for compile range %s takes %.2f s"'),
    ("compilation/monitor.py", '"torch.compile took %.2f s in total"'),
    ("v1/worker/gpu_model_runner.py", '"Graph capturing finished in %.0f secs, took %.2f GiB"'),
])
def test_marker_formats_exist_in_the_locked_vllm(rel, fmt):
    """The log lines the bench looks for are the ones this vLLM writes (fails if vLLM rewords them)."""
    assert fmt in (VLLM / rel).read_text()


def test_markers_parse_vllm_lines():
    lines = [
        (3.0, "INFO 11-29 [default_loader.py:398] Loading weights took 1.25 seconds"),
        (3.5, "(EngineCore pid=1) INFO [gpu_model_runner.py:5188] Model loading took 5.76 GiB memory and 2.500000 seconds"),
        (9.0, "INFO [backends.py:1149] Dynamo bytecode transform time: 4.10 s"),
        (15.0, "INFO [backends.py:394] Compiling a graph for compile range (1, 2048) takes 6.02 s"),
        (15.5, "INFO [backends.py:293] Directly load the compiled graph(s) for compile range (1, 2048) from the cache, took 0.812 s"),
        (16.0, "INFO [monitor.py:20] torch.compile took 10.50 s in total"),
        (20.0, "INFO [gpu_model_runner.py:6586] Graph capturing finished in 3 secs, took 0.50 GiB"),
        (21.0, "INFO [core.py:307] init engine (profile, create kv cache, warmup model) took 12.00 s (compilation: 10.50 s)"),
        (22.0, "unrelated line"),
    ]
    m = svb.markers(lines)
    assert m["weights_loaded"] == [{"s": 1.25, "at": 3.0}]
    assert m["model_loading"][0]["s"] == 2.5
    assert m["dynamo_transform"][0]["s"] == 4.1
    assert m["compile_range"][0]["s"] == 6.02
    assert m["compiled_graph_loaded"][0]["s"] == 0.812
    assert m["torch_compile_total"][0]["s"] == 10.5
    assert m["cuda_graphs"][0]["s"] == 3.0
    assert m["engine_init"][0] == {"s": 12.0, "at": 21.0}


def test_trinity_config_passes_trinitys_validation(tmp_path, tiny_model):
    cfg = svb.trinity_config(tmp_path / "c.yaml", model=tiny_model, label="t", max_model_len=2048, gpu_util=0.6,
                             proxy_port=18010, ckpt=tmp_path / "ckpt", db_url=None)
    r = run_python(
        """
        import json, sys
        from trinity.common.config import load_config
        c = load_config(sys.argv[1]); c.check_and_update()
        e = c.explorer
        print(json.dumps([c.mode, e.listen_address, e.proxy_port, c.synchronizer.sync_method.value,
                          e.rollout_model.gpu_memory_utilization, c.model.temperature]))
        """,
        str(cfg),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["serve", "127.0.0.1", 18010, "checkpoint", 0.6, 1.0]


DOUBLE_CHILD = f"""
import sys, time
sys.path.insert(0, {str(REPO / 'bench')!r})
from openai_double import OpenAIDouble
time.sleep(float(sys.argv[1]))  # "start-up" before it listens
with OpenAIDouble() as d:
    print("URL", d.base_url, flush=True)
    time.sleep(600)
"""


def _url_from(proc):
    for _, line in proc.lines:
        if line.startswith("URL "):
            return line.split()[1]
    return None


def test_wait_ready_finds_and_answers_then_stop_ends_the_group(tmp_path):
    p = svb.Proc([sys.executable, "-c", DOUBLE_CHILD, "1.0"], tmp_path / "double.log", env={})
    try:
        r = svb.wait_ready(None, p, time.monotonic() + 60, lambda: _url_from(p))
        assert r["ready"], r
        assert r["model"] == "test-double-model"
        assert 1.0 <= r["models_s"] <= r["first_answer_s"]
        assert svb.find_openai_servers({int(r["base_url"].rsplit(":", 1)[1])}, exclude=set()) == [r["base_url"]]
    finally:
        st = p.stop(grace_s=10)
    assert st["signals"][0] == "SIGINT" and not p.alive()
    assert "[+" in (tmp_path / "double.log").read_text()  # every line stamped


def test_wait_ready_reports_an_early_exit(tmp_path):
    p = svb.Proc([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "x.log", env={})
    r = svb.wait_ready("http://127.0.0.1:9", p, time.monotonic() + 30)
    p.stop()
    assert not r["ready"] and "exited with 3" in r["error"]


def test_summary_ratios():
    lv = lambda c, tps: {"concurrency": c, "output_tokens_per_s": tps}  # noqa: E731
    result = {"label": "x", "phases": {
        "bare": {"ready": {"ready": True, "first_answer_s": 100.0},
                 "load": {"levels": [lv(1, 100.0), lv(32, 1000.0)]},
                 "load_like_proxy": {"levels": [lv(1, 90.0), lv(32, 950.0)]}},
        "trinity": {"ready": {"ready": True, "first_answer_s": 150.0},
                    "load": {"levels": [lv(1, 80.0), lv(32, 900.0)]},
                    "load_engine_direct": {"levels": [lv(32, 940.0)]}},
        "manual": {"ready": {"ready": True, "first_answer_s": 200.0, "first_answer_incl_ray_start_s": 210.0}},
    }}
    s = svb.summary(result)
    assert s["ready_s"] == {"bare": 100.0, "trinity": 150.0, "manual": 210.0}
    assert s["ready_ratio_trinity_vs_bare"] == 1.5 and s["ready_ratio_manual_vs_bare"] == 2.1
    assert s["throughput_ratio"]["32"] == {"bare_tok_s": 1000.0, "bare_like_proxy_tok_s": 950.0, "bare_like_proxy_vs_bare": 0.95,
                                          "engine_direct_tok_s": 940.0, "engine_direct_vs_bare": 0.94,
                                          "proxy_tok_s": 900.0, "proxy_vs_bare": 0.9}
    assert s["throughput_ratio"]["1"]["proxy_vs_bare"] == 0.8 and "engine_direct_tok_s" not in s["throughput_ratio"]["1"]
    assert "throughput_ratio_spread" not in s


def test_summary_adds_the_cold_start_and_mp_phases_next_to_trinity():
    """trinity-cold (RFTSTACK_WARM_WORKERS=0) and trinity-mp (the mp executor, its worker spawned): their times to
    ready beside trinity's, against bare's."""
    result = {"label": "x", "phases": {
        "bare": {"ready": {"ready": True, "first_answer_s": 40.0}},
        "trinity": {"ready": {"ready": True, "first_answer_s": 60.0}},
        "trinity-mp": {"ready": {"ready": True, "first_answer_s": 70.0}},
        "trinity-cold": {"ready": {"ready": True, "first_answer_s": 90.0}},
    }}
    s = svb.summary(result)
    assert s["ready_s"] == {"bare": 40.0, "trinity": 60.0, "trinity-mp": 70.0, "trinity-cold": 90.0}
    assert s["ready_ratio_trinity_vs_bare"] == 1.5 and s["ready_ratio_trinity_cold_vs_bare"] == 2.25
    assert s["ready_ratio_trinity_mp_vs_bare"] == 1.75
    for phase in ("trinity-cold", "trinity-mp"):
        assert phase in svb.PHASES and phase in svb.SWITCHED


def test_summary_adds_the_nogroup_phase_and_the_spread_load():
    lv = lambda c, tps: {"concurrency": c, "output_tokens_per_s": tps}  # noqa: E731
    result = {"label": "x", "phases": {
        "bare": {"ready": {"ready": True, "first_answer_s": 40.0},
                 "load": {"levels": [lv(32, 1000.0)]}, "load_spread": {"levels": [lv(32, 800.0), lv(64, 1000.0)]}},
        "trinity": {"ready": {"ready": True, "first_answer_s": 90.0},
                    "load": {"levels": [lv(32, 700.0)]}, "load_spread": {"levels": [lv(32, 720.0), lv(64, 800.0)]}},
        "trinity-nogroup": {"ready": {"ready": True, "first_answer_s": 95.0},
                            "load": {"levels": [lv(32, 550.0)]}, "load_spread": {"levels": [lv(32, 600.0)]}},
    }}
    s = svb.summary(result)
    assert s["throughput_ratio"]["32"] == {"bare_tok_s": 1000.0, "proxy_tok_s": 700.0, "proxy_vs_bare": 0.7,
                                          "proxy_nogroup_tok_s": 550.0, "proxy_nogroup_vs_bare": 0.55}
    assert s["throughput_ratio_spread"]["32"] == {"bare_tok_s": 800.0, "proxy_tok_s": 720.0, "proxy_vs_bare": 0.9,
                                                 "proxy_nogroup_tok_s": 600.0, "proxy_nogroup_vs_bare": 0.75}
    assert s["throughput_ratio_spread"]["64"] == {"bare_tok_s": 1000.0, "proxy_tok_s": 800.0, "proxy_vs_bare": 0.8}


def test_bad_phase_and_missing_model_are_one_sentence(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, str(REPO / "bench/serve_vs_bare.py"), "--model", str(tmp_path), "--label", "x",
                        "--out", str(tmp_path / "o"), "--phases", "bare,nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown phase 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, str(REPO / "bench/serve_vs_bare.py"), "--model", str(tmp_path), "--label", "x",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no config.json" in r.stderr
    (tmp_path / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, str(REPO / "bench/serve_vs_bare.py"), "--model", str(tmp_path), "--label", "x",
                        "--out", str(tmp_path / "o"), "--spread", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--spread 1.0 must be at least 0 and below 1" in r.stderr and "Traceback" not in r.stderr


def test_warmup_level_is_parsed_or_refused_in_one_sentence(tmp_path):
    import subprocess

    assert svb.parse_warmup_level("") == (0, 0) and svb.parse_warmup_level(" 32:512 ") == (32, 512)
    (tmp_path / "config.json").write_text("{}")
    for bad in ("32", "0:10", "32:x", "32:-1"):
        r = subprocess.run([sys.executable, str(REPO / "bench/serve_vs_bare.py"), "--model", str(tmp_path), "--label", "x",
                            "--out", str(tmp_path / "o"), f"--warmup-level={bad}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == (f"serve_vs_bare: --warmup-level {bad!r} must be CONCURRENCY:REQUESTS, two positive "
                                    f"numbers (e.g. 32:512)")
    assert not (tmp_path / "o").exists()  # refused before anything starts


def test_warmup_level_runs_apart_from_the_measured_levels(tmp_path):
    """Bench.warm_up against a TEST DOUBLE of vLLM's OpenAI server (no GPU here): N requests at concurrency C,
    summarised as a load of its own, which the ratios never read."""
    from doubles.vllm_stream_double import VLLMStreamDouble

    (tmp_path / "config.json").write_text("{}")
    args = svb.parser().parse_args(["--model", str(tmp_path), "--label", "w", "--out", str(tmp_path / "o"),
                                    "--warmup-level", "8:40", "--max-tokens", "4"])
    bench = svb.Bench(args)
    assert bench.result["settings"]["warmup_level"] == "8:40"
    with VLLMStreamDouble() as double:
        r: dict = {}
        bench.warm_up(r, double.base_url, "bare", None)
        assert len(double.bodies) == 40 + 4  # the level's requests and loadgen's 4 unmeasured ones before it
        none = svb.Bench(svb.parser().parse_args(["--model", str(tmp_path), "--label", "n", "--out", str(tmp_path / "n")]))
        untouched: dict = {}
        none.warm_up(untouched, double.base_url, "bare", None)
        assert untouched == {} and len(double.bodies) == 44  # without --warmup-level: no request, no key
    warm = r["warmup_level"]
    [level] = warm["levels"]
    assert (level["concurrency"], level["requests"], level["ok"]) == (8, 40, 40)
    assert warm["label"] == "bare-warmup"
    lv = {"concurrency": 32, "output_tokens_per_s": 1000.0}
    ready = {"ready": True, "first_answer_s": 100.0}
    phases = {"bare": {"ready": ready, "warmup_level": {"levels": [{**lv, "output_tokens_per_s": 1.0}]},
                       "load": {"levels": [lv]}},
              "trinity": {"ready": ready, "warmup_level": {"levels": [{**lv, "output_tokens_per_s": 9.0}]},
                          "load": {"levels": [{**lv, "output_tokens_per_s": 900.0}]}}}
    assert svb.summary({"label": "w", "phases": phases})["throughput_ratio"]["32"]["proxy_vs_bare"] == 0.9


def test_the_long_runs_levels_record_the_gpu(tmp_path):
    """Bench.load (every measured level of a long run) against a TEST DOUBLE of vLLM's OpenAI server: each level
    carries how busy the GPU was (bench/gpu_busy.py); with no driver here, the phrase why."""
    from doubles.vllm_stream_double import VLLMStreamDouble

    (tmp_path / "config.json").write_text("{}")
    args = svb.parser().parse_args(["--model", str(tmp_path), "--label", "g", "--out", str(tmp_path / "o"),
                                    "--concurrency", "2", "--requests", "6", "--max-tokens", "4"])
    with VLLMStreamDouble() as double:
        load = svb.Bench(args).load(double.base_url, "bare", like_proxy=False)
    [level] = load["levels"]
    assert level["ok"] == 6 and level["gpu"]["error"].startswith("NVML unavailable: ")


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="on a GPU machine this would really serve")
def test_dry_run_without_gpu_records_the_failed_start_and_merges_calls(tmp_path, tiny_model):
    """The real `vllm serve` fails fast without a GPU: the run records it, leaves nothing running,
    and a second call with the same label adds to the same file."""
    import os
    import subprocess

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    argv = [sys.executable, str(REPO / "bench/serve_vs_bare.py"), "--model", str(tiny_model), "--label", "dry",
            "--out", str(tmp_path), "--phases", "bare", "--budget-s", "200", "--ready-timeout", "120", "--no-ray-stop"]
    for _ in range(2):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "serve-dry.json").read_text())
    bare = res["phases"]["bare"]
    assert bare["ready"]["ready"] is False and "exited with" in bare["ready"]["error"]
    assert bare["log_tail"] and bare["argv"][:2] == ["vllm", "serve"]
    assert len(res["earlier_calls"]) == 1
    assert "[+" in (tmp_path / "logs" / "dry-bare.log").read_text()


def test_merge_serve_combines_phases_and_recomputes_the_summary(tmp_path):
    import subprocess

    lv = lambda c, tps: {"concurrency": c, "output_tokens_per_s": tps}  # noqa: E731
    a = {"label": "m", "command": "call 1", "phases": {"bare": {"ready": {"ready": True, "first_answer_s": 100.0},
                                                                "load": {"levels": [lv(32, 1000.0)]}}}}
    b = {"label": "m", "command": "call 2", "phases": {"trinity": {"ready": {"ready": True, "first_answer_s": 120.0},
                                                                   "load": {"levels": [lv(32, 960.0)]}}}}
    for name, r in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(r))
    r = subprocess.run([sys.executable, str(REPO / "bench/merge_serve.py"), "--out", str(tmp_path / "m.json"),
                        str(tmp_path / "a.json"), str(tmp_path / "b.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "m.json").read_text())
    assert set(m["phases"]) == {"bare", "trinity"} and m["earlier_calls"][0]["command"] == "call 1"
    assert m["summary"]["ready_ratio_trinity_vs_bare"] == 1.2
    assert m["summary"]["throughput_ratio"]["32"]["proxy_vs_bare"] == 0.96
    (tmp_path / "c.json").write_text(json.dumps({**b, "label": "other"}))
    r = subprocess.run([sys.executable, str(REPO / "bench/merge_serve.py"), "--out", str(tmp_path / "x.json"),
                        str(tmp_path / "a.json"), str(tmp_path / "c.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "different models" in r.stderr


def test_find_openai_servers_skips_ports_that_do_not_speak_http():
    """On the H200 the engine search hit a gRPC port (HTTP/2 frames: BadStatusLine) and lost the
    phase; now such ports are skipped and a real OpenAI-style server is still found."""
    import http.server
    import socket
    import threading

    grpc_like = socket.socket()
    grpc_like.bind(("127.0.0.1", 0))
    grpc_like.listen()

    def answer_h2() -> None:
        while True:
            try:
                conn, _ = grpc_like.accept()
            except OSError:
                return
            conn.recv(65536)  # the HTTP/1 request, answered with HTTP/2 SETTINGS and GOAWAY bytes
            conn.sendall(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00@\x00\x00\x00\x05\x00@\x00\x00\x00\x00\x00\x08\x07\n")
            conn.close()

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threads = [threading.Thread(target=answer_h2, daemon=True), threading.Thread(target=httpd.serve_forever, daemon=True)]
    for t in threads:
        t.start()
    try:
        ports = {grpc_like.getsockname()[1], httpd.server_address[1]}
        assert svb.find_openai_servers(ports, exclude=set()) == [f"http://127.0.0.1:{httpd.server_address[1]}"]
    finally:
        httpd.shutdown()
        grpc_like.close()


@pytest.mark.parametrize("phase, key, c, tps, spread, ratios, var", [
    ("trinity-noff", "noff", 64, (1000.0, 950.0, 610.0), (960.0, 700.0), (0.95, 0.61, 0.7), ("FAST_FORWARD_VAR", "RFTSTACK_PROXY_FAST_FORWARD")),
    ("trinity-nogc", "nogc", 32, (1000.0, 900.0, 800.0), (960.0, 920.0), (0.9, 0.8, 0.92), ("GC_VAR", "RFTSTACK_PROXY_GC")),
    ("trinity-mp", "mp", 64, (1000.0, 600.0, 750.0), (700.0, 900.0), (0.6, 0.75, 0.9), ("EXECUTOR_VAR", "RFTSTACK_ENGINE_EXECUTOR")),
    ("trinity-nonumeric", "nonumeric", 64, (1000.0, 800.0, 650.0), (900.0, 800.0), (0.8, 0.65, 0.8), ("NUMERIC_VAR", "RFTSTACK_PROXY_NUMERIC_LOGPROBS")),
    ("trinity-mp-fork", "mp_fork", 64, (1000.0, 800.0, 900.0), (900.0, 950.0), (0.8, 0.9, 0.95), ("FORK_VAR", "RFTSTACK_VLLM_FORK_WORKERS")),
    ("trinity-uni", "uni", 32, (1000.0, 900.0, 850.0), (900.0, 800.0), (0.9, 0.85, 0.8), ("EXECUTOR_VAR", "RFTSTACK_ENGINE_EXECUTOR")),
    ("trinity-nobuild", "nobuild", 32, (1000.0, 880.0, 850.0), (900.0, 800.0), (0.88, 0.85, 0.8), ("BUILD_VAR", "RFTSTACK_PROXY_BUILD_PROCESSES")),
    ("trinity-late", "late", 32, (1000.0, 880.0, 870.0), (900.0, 850.0), (0.88, 0.87, 0.85), ("EARLY_VAR", "RFTSTACK_PROXY_BUILDERS_EARLY")),
])
def test_summary_adds_a_switched_off_phase_next_to_the_proxy(phase, key, c, tps, spread, ratios, var):
    """The phases that run the proxy with one patch switched off get their own ratios beside the proxy's."""
    lv = lambda tok_s: {"levels": [{"concurrency": c, "output_tokens_per_s": tok_s}]}  # noqa: E731
    bare, proxy, off = tps
    result = {"label": "x", "phases": {
        "bare": {"load": lv(bare), "load_spread": lv(1000.0)},
        "trinity": {"load": lv(proxy), "load_spread": lv(spread[0])},
        phase: {"load": lv(off), "load_spread": lv(spread[1])},
    }}
    s = svb.summary(result)
    assert s["throughput_ratio"][str(c)] == {"bare_tok_s": bare, "proxy_tok_s": proxy, "proxy_vs_bare": ratios[0],
                                             f"proxy_{key}_tok_s": off, f"proxy_{key}_vs_bare": ratios[1]}
    assert s["throughput_ratio_spread"][str(c)][f"proxy_{key}_vs_bare"] == ratios[2]
    assert phase in svb.PHASES and getattr(svb, var[0]) == var[1] and var[1] in svb.SWITCHED[phase]


def test_summary_adds_the_steady_state_ratio_beside_each_ratio():
    """Levels that carry loadgen's ``steady`` get <key>_steady_vs_bare beside <key>_vs_bare (null when
    either side has no steady figure); levels measured without it keep their rows as they were."""
    def lv(c, tps, steady="absent"):
        level = {"concurrency": c, "output_tokens_per_s": tps}
        if steady != "absent":
            level["steady"] = ({"output_tokens_per_s": steady, "window_s": 2.0} if steady is not None
                               else {"output_tokens_per_s": None, "reason": "window shorter than 0.5 s"})
        return level

    result = {"label": "x", "phases": {
        "bare": {"load": {"levels": [lv(32, 1000.0, 1250.0), lv(64, 1100.0, None), lv(1, 100.0)]},
                 "load_like_proxy": {"levels": [lv(32, 950.0, 1200.0), lv(64, 1050.0, 1300.0), lv(1, 90.0)]},
                 "load_spread": {"levels": [lv(32, 800.0, 1000.0)]}},
        "trinity": {"load": {"levels": [lv(32, 900.0, 1225.0), lv(64, 1000.0, 1200.0), lv(1, 80.0)]},
                    "load_engine_direct": {"levels": [lv(32, 940.0, None)]},
                    "load_spread": {"levels": [lv(32, 760.0, 970.0)]}},
        "trinity-nogc": {"load": {"levels": [lv(32, 800.0)]}},
    }}
    s = svb.summary(result)
    assert s["throughput_ratio"]["32"] == {
        "bare_tok_s": 1000.0, "bare_steady_tok_s": 1250.0,
        "bare_like_proxy_tok_s": 950.0, "bare_like_proxy_vs_bare": 0.95,
        "bare_like_proxy_steady_tok_s": 1200.0, "bare_like_proxy_steady_vs_bare": 0.96,
        "engine_direct_tok_s": 940.0, "engine_direct_vs_bare": 0.94,
        "engine_direct_steady_tok_s": None, "engine_direct_steady_vs_bare": None,
        "proxy_tok_s": 900.0, "proxy_vs_bare": 0.9, "proxy_steady_tok_s": 1225.0, "proxy_steady_vs_bare": 0.98,
        "proxy_nogc_tok_s": 800.0, "proxy_nogc_vs_bare": 0.8, "proxy_nogc_steady_tok_s": None, "proxy_nogc_steady_vs_bare": None,
    }
    # bare's steady figure is null at c=64: every steady ratio of the row is null, the whole-wall ones stay
    r64 = s["throughput_ratio"]["64"]
    assert r64["bare_steady_tok_s"] is None and r64["proxy_steady_tok_s"] == 1200.0
    assert r64["proxy_steady_vs_bare"] is None and r64["bare_like_proxy_steady_vs_bare"] is None and r64["proxy_vs_bare"] == 0.909
    # measured without steady (an earlier loadgen): the row as before
    assert s["throughput_ratio"]["1"] == {"bare_tok_s": 100.0, "bare_like_proxy_tok_s": 90.0, "bare_like_proxy_vs_bare": 0.9,
                                         "proxy_tok_s": 80.0, "proxy_vs_bare": 0.8}
    assert s["throughput_ratio_spread"]["32"] == {"bare_tok_s": 800.0, "bare_steady_tok_s": 1000.0, "proxy_tok_s": 760.0,
                                                 "proxy_vs_bare": 0.95, "proxy_steady_tok_s": 970.0, "proxy_steady_vs_bare": 0.97}


def test_a_switched_phase_sets_its_variables():
    """Each switched phase runs `trinity` with its variables over the environment: trinity-mp the mp executor
    with its worker spawned (upstream's start method), trinity-mp-fork today's defaults spelled out,
    trinity-uni the uni executor. TEST DOUBLE: phase_trinity, which starts `rftstack serve` on a GPU."""
    seen = {}

    class Recording(svb.Bench):
        def __init__(self):  # no arguments, no run directory: only phase_switched is exercised
            pass

        def phase_trinity(self, name, env=None):
            seen[name] = env
            return {"ready": {"ready": True}}

    bench = Recording()
    assert bench.phase_switched("trinity-mp-fork")["env"] == {"RFTSTACK_ENGINE_EXECUTOR": "mp", "RFTSTACK_VLLM_FORK_WORKERS": "1"}
    assert bench.phase_switched("trinity-mp")["env"] == {"RFTSTACK_ENGINE_EXECUTOR": "mp", "RFTSTACK_VLLM_FORK_WORKERS": "0"}
    assert bench.phase_switched("trinity-uni")["env"] == {"RFTSTACK_ENGINE_EXECUTOR": "uni"}
    assert seen["trinity-mp"]["RFTSTACK_VLLM_FORK_WORKERS"] == "0" and seen["trinity-mp"]["RFTSTACK_ENGINE_EXECUTOR"] == "mp"
    assert seen["trinity-uni"].get("RFTSTACK_VLLM_FORK_WORKERS") == os.environ.get("RFTSTACK_VLLM_FORK_WORKERS")
    assert seen["trinity-uni"]["PYTHONUNBUFFERED"] == "1"  # over Bench.env(), not in place of it


def test_a_phase_that_compiled_the_model_before_ready_is_named_not_warm(tmp_path, monkeypatch):
    """Session AL's `ready-3b-late` ran first on its machine: bare and trinity compiled the model (vLLM's compile cache
    grew during their start), so their times to ready were not warm ones. Each phase records the cache before its
    server starts and once it is ready; the summary names the phases whose start added files."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    cache = tmp_path / "torch_compile_cache" / "abc"
    before = svb.compile_cache_state()
    assert before == {"path": str(tmp_path / "torch_compile_cache"), "files": 0, "bytes": 0}
    cache.mkdir(parents=True)
    for i in range(3):
        (cache / f"graph{i}.py").write_text("x" * 10)
    at_ready = svb.compile_cache_state()
    assert (at_ready["files"], at_ready["bytes"]) == (3, 30)
    ready = {"ready": True, "first_answer_s": 60.0}
    phases = {"bare": {"ready": ready, "compile_cache_before": before, "compile_cache_at_ready": at_ready},
              "trinity": {"ready": {**ready, "first_answer_s": 74.0}, "compile_cache_before": at_ready,
                          "compile_cache_at_ready": svb.compile_cache_state()},
              "trinity-late": {"ready": ready, "compile_cache_before": before},  # recorded before the measurement
              "trinity-mp": {"ready": {"ready": False}, "compile_cache_before": before, "compile_cache_at_ready": at_ready}}
    assert [svb.compiled_before_ready(p) for p in phases.values()] == [3, 0, None, None]
    s = svb.summary({"label": "x", "phases": phases})
    assert s["compiled_before_ready"] == {"bare": 3}
    assert svb.done_line("bare", phases["bare"]) == ("bare: done; ready=True first answer 60.0 s; compiled the model "
                                                     "(3 new files in vLLM's compile cache): not a warm start")
    assert svb.done_line("trinity", phases["trinity"]) == "trinity: done; ready=True first answer 74.0 s"
    del phases["bare"]
    assert "compiled_before_ready" not in svb.summary({"label": "x", "phases": phases})


def test_summary_adds_the_engine_reached_directly_with_spread_lengths():
    """--engine-direct-spread: the proxy's request sent straight to Trinity's engine at the spread levels, beside the
    proxy's spread load, so a loss with spread lengths can be told to lie in the engine or in the proxy."""
    lv = lambda c, tps: {"concurrency": c, "output_tokens_per_s": tps}  # noqa: E731
    result = {"label": "x", "phases": {
        "bare": {"ready": {"ready": True, "first_answer_s": 40.0}, "load_spread": {"levels": [lv(64, 1000.0)]}},
        "trinity": {"ready": {"ready": True, "first_answer_s": 55.0}, "load_spread": {"levels": [lv(64, 760.0)]},
                    "load_engine_direct_spread": {"levels": [lv(64, 950.0)]}},
    }}
    assert svb.summary(result)["throughput_ratio_spread"]["64"] == {
        "bare_tok_s": 1000.0, "engine_direct_tok_s": 950.0, "engine_direct_vs_bare": 0.95, "proxy_tok_s": 760.0,
        "proxy_vs_bare": 0.76}


def test_engine_direct_spread_without_spread_is_one_sentence(tmp_path, tiny_model, capsys):
    assert svb.main(["--model", str(tiny_model), "--label", "x", "--out", str(tmp_path), "--engine-direct-spread"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "serve_vs_bare: --engine-direct-spread loads the spread levels; give --spread too (e.g. --spread 0.75)"
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_the_engine_direct_loads_send_what_the_proxy_sends(tmp_path, monkeypatch):
    """The engine reached directly, and bare's like-proxy load, get the proxy's own request: the fields with numeric logprobs while the
    numeric-logprobs patch is on (its default), the JSON fields where the bench's environment switches it off
    (sessions AM and AN sent the JSON fields whatever the proxy sent). The numeric request carries the patch's
    mark, as a TEST DOUBLE of vLLM's server receives it through Bench.load."""
    from doubles.vllm_stream_double import VLLMStreamDouble

    assert svb.engine_direct_request({}) == svb.loadgen.NUMERIC
    assert svb.engine_direct_request({svb.NUMERIC_VAR: "1"}) == svb.loadgen.NUMERIC
    assert svb.engine_direct_request({svb.NUMERIC_VAR: "0"}) == "json"
    (tmp_path / "config.json").write_text("{}")
    args = svb.parser().parse_args(["--model", str(tmp_path), "--label", "n", "--out", str(tmp_path / "o"),
                                    "--concurrency", "2", "--requests", "4", "--max-tokens", "4"])
    bench = svb.Bench(args)
    assert bench.proxy_fields() == (svb.loadgen.NUMERIC, svb.loadgen.NUMERIC)
    with VLLMStreamDouble() as double:
        bench.load(double.base_url, "trinity-engine-direct", like_proxy=bench.proxy_fields()[1])
        bodies = list(double.bodies)
    assert bodies and all(b["vllm_xargs"] == {"rftstack_logprobs_numeric": 1} and b["logprobs"] is True for b in bodies)
    monkeypatch.setenv(svb.NUMERIC_VAR, "0")  # the proxy switched back to upstream's logprobs objects
    assert bench.proxy_fields() == ("json", True)
