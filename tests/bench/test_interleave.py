"""bench/interleave.py's pieces that run without a GPU: the rounds' order, the rounds of real loadgen levels against
two TEST DOUBLE OpenAI servers (bench/openai_double.py stands in for vLLM, which needs a GPU) of known speeds, the
figures and table read from what they wrote, and bad input. Starting `rftstack serve` and `vllm serve` together
needs the GPU host (tests/gpu/host_session.sh's interleave3b)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import interleave as il
import proxy_overhead as po

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "interleave.py"


def test_each_round_turns_the_order_by_one():
    assert [il.order_for(["bare", "trinity"], r) for r in (1, 2, 3, 4)] == [
        ["bare", "trinity"], ["trinity", "bare"], ["bare", "trinity"], ["trinity", "bare"]]
    three = [il.order_for(["bare", "trinity", "engine"], r)[0] for r in (1, 2, 3, 4)]
    assert three == ["bare", "trinity", "engine", "bare"]  # each path leads in turn


def test_the_levels_are_the_long_runs_equal_then_spread():
    assert il.level_specs([32, 64], [32, 64], 0.75) == [
        ("c=32 equal", 32, 0.0), ("c=64 equal", 64, 0.0), ("c=32 spread", 32, 0.75), ("c=64 spread", 64, 0.75)]
    assert il.level_specs([8], [8], 0.0) == [("c=8 equal", 8, 0.0)]


def test_rounds_against_two_servers_of_known_speeds(tmp_path):
    """Two TEST DOUBLE servers, the second twice as slow a token: its pooled ratio against the first ("bare") is
    about 0.5 at every level, each round's order alternates, every level keeps loadgen's figures and the GPU's
    phrase (no driver here), and the table is read back from the saved JSON."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast, fast_url = po.start_double(tmp_path / "a", per_token_s=0.004)
    slow, slow_url = po.start_double(tmp_path / "b", per_token_s=0.008)
    out = tmp_path / "result.json"
    result: dict = {}
    said: list[str] = []
    try:
        paths = [il.LoadPath("bare", fast_url, False, "test-double-model"),
                 il.LoadPath("trinity", slow_url, False, "test-double-model")]
        args = SimpleNamespace(rounds=2, levels=[2, 4], spread_levels=[4], spread=0.5, requests_per_client=3,
                               max_tokens=8, level_timeout=30.0)
        il.run_rounds(paths, args, result, lambda: out.write_text(json.dumps(result)), said.append)
    finally:
        po.stop(fast)
        po.stop(slow)
    saved = json.loads(out.read_text())
    assert [r["order"] for r in saved["rounds"]] == [["bare", "trinity"], ["trinity", "bare"]]
    assert list(saved["rounds"][0]["levels"]) == ["c=2 equal", "c=4 equal", "c=4 spread"]
    lv = saved["rounds"][1]["levels"]["c=4 spread"]["trinity"]
    assert lv["requests"] == lv["ok"] == 12 and lv["concurrency"] == 4
    assert lv["gpu"]["error"].startswith("NVML unavailable: ") and "engine" not in lv
    assert len(said) == 2 * 3 * 2 and said[0].startswith("round 1 c=2 equal bare: ")
    figs = il.figures(saved)
    for key in ("c=2 equal", "c=4 equal", "c=4 spread"):
        f = figs[key]["trinity"]
        assert len(f["rounds"]) == 2 and 0.35 < f["pooled"] < 0.7, (key, f)
        assert f["min"] <= f["pooled"] <= f["max"] or abs(f["max"] - f["min"]) < 0.05
        assert all(p > 1.3 for p in f["p99_rounds"])  # twice the time a token: the slower tail
    table = subprocess.run([sys.executable, str(SCRIPT), "--table", str(out)], capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    rows = [r for r in table.stdout.splitlines() if r.startswith("| c=")]
    assert len(rows) == 3 and rows[0].startswith("| c=2 equal | trinity | ")
    assert f"| {figs['c=2 equal']['trinity']['pooled']:.2f} |" in rows[0]


def test_a_failed_request_keeps_a_round_out_of_the_figures():
    lv = lambda ok, tok: {"ok": ok, "requests": 4, "output_tokens_per_s": tok, "output_tokens": tok,  # noqa: E731
                          "wall_s": 1.0, "latency_s": {"p99": 1.0}}
    result = {"paths": {"bare": {}, "trinity": {}}, "levels": [{"key": "c=4 equal"}],
              "rounds": [{"levels": {"c=4 equal": {"bare": lv(4, 100.0), "trinity": lv(4, 90.0)}}},
                         {"levels": {"c=4 equal": {"bare": lv(4, 100.0), "trinity": lv(3, 10.0)}}}]}
    f = il.figures(result)["c=4 equal"]["trinity"]
    assert f["rounds"] == [0.9] and f["pooled"] == pytest.approx(0.9)


@pytest.mark.parametrize("argv, says", [
    (["--model", "/nonexistent/model", "--out", "x.json"], "--model /nonexistent/model: no such directory"),
    (["--model", ".", "--out", "x.json", "--gpu-util", "0.5"], "--gpu-util 0.5 for 2 servers"),
    (["--model", ".", "--out", "x.json", "--gpu-util", "0.3", "--bare-variants", "--seed 1;--seed 2"],
     "--gpu-util 0.3 for 4 servers"),
    (["--model", ".", "--out", "x.json", "--spread", "1.5"], "--spread 1.5: give a share between 0"),
    (["--model", ".", "--out", "x.json", "--rounds", "0"], "--rounds, --requests-per-client and --level-timeout must be positive"),
    (["--model", ".", "--out", "x.json", "--gpu-util", "0.2", "--bare-variants", "--seed 1;--seed 1"], "names a variant twice"),
    (["--model", ".", "--out", "x.json", "--concurrency", "a"], "concurrency"),
    (["--out", "x.json"], "give --model DIR and --out RESULT.json"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "none;slow=3"], "--hops entry 'slow=3': give none"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "wait=x"], "'x' is not a number of milliseconds"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "wait=-1"], "milliseconds cannot be negative"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "none; none"], "names a setting twice"),
    (["--model", ".", "--out", "x.json", "--hops", "none"], "give --engine-direct too"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "store=nvme"], "store= takes disk"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--hops", "group=5,store=disk"], "give it or store=, not both"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--proxies", "nope"], "--proxies: unknown variant 'nope'"),
    (["--model", ".", "--out", "x.json", "--engine-direct", "--proxies", "hop-gc+actor"], "+actor starts a Ray node"),
    (["--model", ".", "--out", "x.json", "--proxies", "hop-gc"], "give --engine-direct too"),
    (["--table", "x.json", "--steps", "--latency"], "--steps and --latency are two tables: give one"),
])
def test_bad_input_is_one_sentence_and_starts_nothing(tmp_path, argv, says):
    r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("interleave: ") and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("content, says", [
    ("{}", "holds no round with a bare level"),
    ("not json", "JSONDecodeError"),
])
def test_a_table_of_a_bad_result_is_one_sentence(tmp_path, content, says):
    f = tmp_path / "r.json"
    f.write_text(content)
    r = subprocess.run([sys.executable, str(SCRIPT), "--table", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.rstrip().endswith("give a result file bench/interleave.py wrote")


def test_a_serve_that_cannot_start_is_one_sentence_and_leaves_nothing_running(tmp_path):
    """The real `rftstack serve` on this machine (no GPU: its preflight fails): interleave says which server was not
    ready and where its log is, exits 1, starts no bare server, and the result records the serve's stop."""
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "r" / "result.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--out", str(out), "--no-ray-stop",
                        "--ready-timeout", "120"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("interleave: ")]
    assert len(err) == 1 and "rftstack serve was not ready (exited with" in err[0]
    assert err[0].endswith(str(out.parent / "result-serve.log"))
    saved = json.loads(out.read_text())
    assert list(saved["servers"]) == ["trinity"] and "rounds" not in saved
    assert saved["servers"]["trinity"]["stop"]["rc"] not in (None, 0)
    assert saved["servers"]["trinity"]["ray_stop"] == {"skipped": "--no-ray-stop"}
    left = subprocess.run(["pgrep", "-f", str(out.parent)], capture_output=True, text=True)
    assert left.stdout == ""


def test_steps_split_each_step_into_gpu_busy_and_idle_time():
    """The engine's 200 steps a second (5 ms a step) at 70 % busy: 3.5 ms of GPU work and 1.5 ms idle a step; the
    means are over the rounds, and a level without the engine's account is left out."""
    lv = lambda sps, busy: {"engine": {"steps_per_s": sps, "tokens_per_step": 50.0}, "gpu": {"busy_pct": busy},  # noqa: E731
                            "machine": {"busy_cores": 2.0}}
    result = {"paths": {"bare": {}, "trinity": {}}, "levels": [{"key": "c=64 equal"}],
              "rounds": [{"levels": {"c=64 equal": {"bare": lv(250.0, 87.5), "trinity": lv(200.0, 70.0)}}},
                         {"levels": {"c=64 equal": {"bare": lv(250.0, 87.5), "trinity": {"gpu": {"error": "x"}}}}}]}
    f = il.steps(result)["c=64 equal"]
    assert f["trinity"]["rounds"] == 1 and f["bare"]["rounds"] == 2
    assert f["trinity"]["step_ms"] == pytest.approx(5.0)
    assert f["trinity"]["gpu_busy_ms_per_step"] == pytest.approx(3.5)
    assert f["trinity"]["gpu_idle_ms_per_step"] == pytest.approx(1.5)
    assert f["bare"]["gpu_busy_ms_per_step"] == pytest.approx(3.5) and f["bare"]["gpu_idle_ms_per_step"] == pytest.approx(0.5)
    assert "| c=64 equal | trinity | 1 | 200.0 | 50.0 | 70.0 | 5.00 | 3.50 | 1.50 | 2.00 |" in il.steps_table(result)


def test_steps_of_a_run_without_the_engines_account_is_one_sentence(tmp_path):
    """A run against servers without vLLM's statistics (here: a result without them) has no steps table."""
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"paths": {"bare": {}}, "levels": [{"key": "c=4 equal"}],
                             "rounds": [{"levels": {"c=4 equal": {"bare": {"gpu": {"busy_pct": 50.0}}}}}]}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--table", str(f), "--steps"], capture_output=True, text=True)
    assert r.returncode == 2 and "no level holds both the engine's account and the GPU's busy share" in r.stderr
    assert r.stderr.count("\n") == 1


def test_the_proxys_counts_or_why_not(tmp_path):
    """The TEST DOUBLE has no /metrics (404): one phrase instead of the proxy's counts."""
    double, url = po.start_double(tmp_path)
    try:
        got = il.proxy_metrics(url)
    finally:
        po.stop(double)
    assert got["error"].startswith("HTTPError: HTTP Error 404")


def test_bare_fields_sends_bare_the_proxys_own_request():
    """--bare-fields's path: bare's server, the proxy's request (numeric logprobs by default, JSON where the proxy's
    patch is switched off), and its requests reach the server so (the in-process TEST DOUBLE keeps their bodies)."""
    import loadgen
    from openai_double import OpenAIDouble

    bare = il.LoadPath("bare", "http://127.0.0.1:1", False, "m", "http://127.0.0.1:1")
    assert il.bare_fields_path(bare, {}).request == loadgen.NUMERIC
    assert il.bare_fields_path(bare, {"RFTSTACK_PROXY_NUMERIC_LOGPROBS": "0"}).request == "json"
    with OpenAIDouble() as double:
        path = il.bare_fields_path(il.LoadPath("bare", double.base_url, False, "test-double-model"), {})
        lv = il.run_level(path, 2, 0.0, 4, SimpleNamespace(max_tokens=4, level_timeout=30.0))
    assert path.name == "bare-fields" and lv["ok"] == lv["requests"] == 4
    asked = [b for b in double.bodies if b["max_tokens"] == 4]
    assert len(asked) >= 4 and all(b["logprobs"] and b["return_token_ids"] for b in asked)
    assert all(b["vllm_xargs"]["rftstack_logprobs_numeric"] for b in asked)


def test_hop_entries_name_their_paths_and_arguments(tmp_path):
    assert il.hop_spec("none") == ("hop", [])
    assert il.hop_spec(" wait=10 ") == ("hop:wait=10", ["--wait-ms", "10"])
    assert il.hop_spec("wait=10,busy=1.5") == ("hop:wait=10,busy=1.5", ["--wait-ms", "10", "--busy-ms", "1.5"])
    out = tmp_path / "r.json"
    assert il.hop_spec("store=disk", out) == ("hop:store=disk", ["--store", str(tmp_path / "r-hop-storedisk.db")])
    assert il.hop_spec("wait=1,store=shm", out) == ("hop:wait=1,store=shm",
                                                    ["--wait-ms", "1", "--store", "/dev/shm/r-hop-wait1-storeshm.db"])


def test_a_hops_store_commits_every_answer_before_it_returns_and_groups_concurrent_ones(tmp_path):
    """store=disk: every answer a row of the hop's SQLite file, committed (counted by the hop's store thread) before
    the answer is returned; 8 clients at once share transactions (fewer commits than rows); the file is removed when
    the stack closes, after the hop's stop."""
    hop, lv, _, stats, result = _hop_level(tmp_path, "store=disk", c=8, requests=32)
    assert lv["ok"] == lv["requests"] == 32
    assert stats["rows"] == stats["answers"] >= 32 and 0 < stats["commits"] < stats["rows"]
    assert stats["commit_ms_mean"] > 0
    assert stats["store"] == str(tmp_path / "r-hop-storedisk.db")
    assert not (tmp_path / "r-hop-storedisk.db").exists() and result["servers"]["hop:store=disk"]["stop"]["rc"] == 0


def test_a_hops_group_releases_the_answers_together_as_a_group_commit_does(tmp_path):
    """group=100: no file, but each answer waits for a 100 ms "commit" (a sleep) that starts after it came; the 4
    answers of a wave share commits (fewer commits than answers), and none comes back sooner than one commit."""
    hop, lv, _, stats, _ = _hop_level(tmp_path, "group=100", c=4, requests=8)
    assert hop.name == "hop:group=100" and lv["ok"] == 8
    assert stats["group_ms"] == 100 and stats["rows"] == stats["answers"] >= 8 and stats["commits"] < stats["rows"]
    assert "commit_ms_mean" not in stats and stats["store"] is None
    assert lv["latency_s"]["p50"] >= 0.1


def test_a_hop_with_a_store_in_a_missing_directory_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "hop.py"), "--upstream", "http://127.0.0.1:9",
                        "--store", str(tmp_path / "no" / "x.db")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"hop: --store {tmp_path / 'no' / 'x.db'}: no such directory")


def test_db_url_puts_the_serves_store_where_it_says(tmp_path):
    """interleave's --db-url reaches the serve's config as explorer.db_url (its default: none, Trinity's own)."""
    import yaml

    import serve_profile as sp

    args = SimpleNamespace(model=str(tmp_path), max_model_len=1024, gpu_util=0.4, db_url="sqlite:////dev/shm/x.db")
    _, _, cfg = sp.serve_config(args, tmp_path / "r.json")
    assert yaml.safe_load(cfg.read_text())["explorer"]["db_url"] == "sqlite:////dev/shm/x.db"
    _, _, cfg = sp.serve_config(SimpleNamespace(model=str(tmp_path), max_model_len=1024, gpu_util=0.4), tmp_path / "s.json")
    assert "db_url" not in yaml.safe_load(cfg.read_text())["explorer"]
    assert il.parser().parse_args(["--db-url", "sqlite:////dev/shm/x.db"]).db_url == "sqlite:////dev/shm/x.db"


def _hop_level(tmp_path, entry: str, c: int = 4, requests: int = 8):
    """One level through bench/hop.py (a real process, ``entry``'s setting) in front of the in-process TEST DOUBLE
    (it stands in for Trinity's engine): the level, the double's request bodies and the hop's counts."""
    from contextlib import ExitStack

    from openai_double import OpenAIDouble

    result: dict = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    with OpenAIDouble() as double, ExitStack() as stack:
        engine = il.LoadPath("engine", double.base_url, "numeric", "test-double-model")
        hop = il.start_hop(entry, engine, tmp_path / "r.json", stack, result, lambda m: None, dict(os.environ))
        lv = il.run_level(hop, c, 0.0, requests, SimpleNamespace(max_tokens=4, level_timeout=30.0))
        stats = il.hop_stats(hop.url)
    return hop, lv, [b for b in double.bodies if b["max_tokens"] == 4], stats, result


def test_a_hop_forwards_plain_requests_with_the_proxys_fields(tmp_path):
    """The hop's path takes plain requests (as the proxy's) and sends the engine the proxy's own request: token ids,
    logprobs, the numeric mark; every answer comes back whole, counted, and the hop is stopped with its stack."""
    hop, lv, bodies, stats, result = _hop_level(tmp_path, "none")
    assert hop.name == "hop" and hop.request is False
    assert lv["ok"] == lv["requests"] == 8 and lv["short_outputs"] == 0
    assert len(bodies) >= 8 and all(b["return_token_ids"] and b["logprobs"] for b in bodies)
    assert all(b["vllm_xargs"]["rftstack_logprobs_numeric"] == 1 for b in bodies)
    assert stats["answers"] >= 8 and stats["errors"] == 0
    assert result["servers"]["hop"]["stop"]["rc"] is not None


def test_a_hops_wait_holds_each_answer_without_its_cpu_and_its_busy_holds_the_loop(tmp_path):
    """wait=150: each of 4 concurrent answers is held 150 ms, side by side (the level takes about one wait a wave);
    busy=150: the hop's one loop is busy 150 ms an answer, so 4 answers of a wave take about 4 x 150 ms."""
    _, waited, _, wstats, _ = _hop_level(tmp_path / "w", "wait=150", c=4, requests=4)
    _, busy, _, bstats, _ = _hop_level(tmp_path / "b", "busy=150", c=4, requests=4)
    assert waited["ok"] == busy["ok"] == 4 and wstats["wait_ms"] == 150 and bstats["busy_ms"] == 150
    assert waited["latency_s"]["p50"] >= 0.15
    assert waited["wall_s"] < 0.45  # the waits overlap
    assert busy["wall_s"] >= 0.55 and busy["latency_s"]["max"] >= 0.55  # the busy answers queue on the one loop


def test_latency_splits_a_request_into_its_time_outside_the_engine_and_its_phases(tmp_path):
    """Client mean 300 ms, the engine's e2e 260 ms: 40 ms outside the engine; the means are over the rounds whose level
    has the engine's request times and every answer; the table is the function's, and a run without them is one
    sentence."""
    eng = lambda e2e, dec: {"mean_s": {"e2e_request_latency": e2e, "request_queue_time": 0.001,  # noqa: E731
                                       "request_prefill_time": 0.02, "request_decode_time": dec}}
    lv = lambda mean, e: {"ok": 4, "requests": 4, "latency_s": {"mean": mean}, "engine": e}  # noqa: E731
    result = {"paths": {"bare": {}, "hop": {}}, "levels": [{"key": "c=32 equal"}],
              "rounds": [{"levels": {"c=32 equal": {"bare": lv(0.25, eng(0.24, 0.2)), "hop": lv(0.30, eng(0.26, 0.22))}}},
                         {"levels": {"c=32 equal": {"bare": lv(0.27, eng(0.26, 0.2)), "hop": {**lv(0.9, eng(0.1, 0.1)), "ok": 3}}}}]}
    f = il.latency(result)["c=32 equal"]
    assert f["hop"]["rounds"] == 1 and f["bare"]["rounds"] == 2
    assert f["hop"]["outside_ms"] == pytest.approx(40.0) and f["hop"]["decode_ms"] == pytest.approx(220.0)
    assert f["bare"]["outside_ms"] == pytest.approx(10.0) and f["bare"]["client_ms"] == pytest.approx(260.0)
    assert "| c=32 equal | hop | 1 | 300.0 | 260.0 | 40.0 | 1.0 | 20.0 | 220.0 |" in il.latency_table(result)
    (tmp_path / "r.json").write_text(json.dumps({"paths": {"bare": {}}, "levels": [{"key": "c=4 equal"}], "rounds": []}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--table", str(tmp_path / "r.json"), "--latency"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no level holds the engine's request times" in r.stderr and r.stderr.count("\n") == 1


def test_a_proxy_variant_is_trinitys_proxy_in_a_process_in_front_of_the_engine(tmp_path):
    """--proxies sqlite-gc+numeric: Trinity's real proxy app and recorder (bench/proxy_overhead.py's child, its model
    allocation a stand-in naming the engine's server, here the in-process TEST DOUBLE) take plain requests, ask the
    engine for token ids and numeric logprobs, record every answer (its rows counted at the stop), and stop with
    the stack."""
    from contextlib import ExitStack

    from openai_double import OpenAIDouble

    result: dict = {}
    out = tmp_path / "r.json"
    with OpenAIDouble() as double, ExitStack() as stack:
        engine = il.LoadPath("engine", double.base_url, "numeric", "test-double-model")
        path = il.start_proxy_variant("sqlite-gc+numeric", engine, out, stack, result, lambda m: None)
        lv = il.run_level(path, 4, 0.0, 12, SimpleNamespace(max_tokens=4, level_timeout=60.0))
    assert path.name == "proxy:sqlite-gc+numeric" and path.request is False and path.metrics_url is None
    assert lv["ok"] == lv["requests"] == 12
    asked = [b for b in double.bodies if b["max_tokens"] == 4]
    assert len(asked) >= 12 and all(b["return_token_ids"] and b["vllm_xargs"]["rftstack_logprobs_numeric"] for b in asked)
    stop = result["servers"]["proxy:sqlite-gc+numeric"]["stop"]
    assert stop["rows"] == len(asked) and stop["rc"] is not None  # loadgen's warm-up requests recorded too
