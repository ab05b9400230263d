"""bench/proc_cpu.py and bench/serve_profile.py's pieces that run without a GPU: the /proc CPU windows
(against real processes of this machine that burn a known amount of CPU), the closed loop's window
(against the TEST DOUBLE OpenAI server, bench/openai_double.py) and the thread profile of a real py-spy
recording of a real asyncio event loop in a thread (as a Ray async actor runs it). The serve itself needs
the GPU host (bench/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import proc_cpu
import proxy_overhead as po
import serve_profile as sp
import stack_frames
from helpers import ENGINE_ARGS_SESSIONS_VW

REPO = Path(__file__).resolve().parents[2]
SPIN = r"""
import threading, time, sys
def spin(seconds):
    end = time.time() + seconds
    while time.time() < end:
        sum(range(1000))
t = threading.Thread(target=spin, args=(60,), name="burner", daemon=True)
t.start()
print("go", flush=True)
time.sleep(60)
"""


@pytest.fixture
def spinner(tmp_path):
    """A real child process (``SPIN``, command line ending ``spinner-marker``) whose one thread spins for a minute,
    started at 5 above this process's niceness and seen spinning ("go") before the test, killed after it."""
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    child = subprocess.Popen([sys.executable, str(script), "spinner-marker"], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.nice(5))  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "go"
        yield SimpleNamespace(pid=child.pid, script=script)
    finally:
        child.kill()
        child.wait()


def test_window_finds_a_busy_thread_and_the_idle_rest(spinner):
    """A child with one thread spinning: its process uses about one core, that thread carries it, its main
    thread (sleeping) none; the window names it by its command line."""
    a = proc_cpu.snapshot()
    t0 = time.monotonic()
    time.sleep(1.5)
    b = proc_cpu.snapshot()
    rows = proc_cpu.window(a, b, time.monotonic() - t0, top=50, responses=10)
    mine = next(r for r in rows if r["pid"] == spinner.pid)
    assert "spinner-marker" in mine["title"]
    assert mine["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    assert 0.5 < mine["cores"] <= 1.1  # one thread's worth (2 shared cores here)
    top = mine["top_threads"][0]
    assert top["tid"] != spinner.pid and top["cores"] > 0.5
    assert mine["cpu_ms_per_response"] == pytest.approx(1000 * mine["cpu_s"] / 10, rel=0.01)
    assert spinner.pid in proc_cpu.find(b, f"{sys.executable} {spinner.script}")


def test_the_machine_window_counts_a_spinning_thread(spinner):
    """/proc/stat over a window with one thread spinning: at least half a core busy, and busy + idle + iowait +
    steal add up to the machine's CPUs (each tick is one of them)."""
    a = proc_cpu.machine_snapshot()
    t0 = time.monotonic()
    time.sleep(1.5)
    b = proc_cpu.machine_snapshot()
    m = proc_cpu.machine_window(a, b, time.monotonic() - t0)
    assert m["cpus"] == os.cpu_count() and m["busy_cores"] >= 0.5
    total = m["busy_cores"] + m["idle_cores"] + m["iowait_cores"] + m["steal_cores"]
    assert total == pytest.approx(m["cpus"], rel=0.1)
    assert proc_cpu.machine_line(m).startswith(f"machine: {m['busy_cores']} of {m['cpus']} cores busy, steal ")


def test_the_machine_window_reads_steal_and_the_cgroups_throttling():
    """The two files' formats (proc(5); the kernel's cgroup-v2 cpu.stat and cpu.max) as a 4-CPU guest with a
    2-CPU limit writes them: steal and throttling come out in cores and ms."""
    tick = proc_cpu.TICK
    before = {"stat": proc_cpu.parse_proc_stat(f"cpu  {10 * tick} 0 {2 * tick} {20 * tick} 0 0 0 {tick} 0 0\ncpu0 1 2 3\n"),
              "cpus": 4, "cgroup": proc_cpu.parse_cpu_stat("usage_usec 100\nnr_periods 10\nnr_throttled 1\nthrottled_usec 5000\n"),
              "cpu_max": "200000 100000"}
    after = {"stat": proc_cpu.parse_proc_stat(f"cpu  {13 * tick} 0 {3 * tick} {22 * tick} 0 0 0 {3 * tick} 0 0\n"),
             "cpus": 4, "cgroup": proc_cpu.parse_cpu_stat("usage_usec 900\nnr_periods 20\nnr_throttled 7\nthrottled_usec 305000\n"),
             "cpu_max": "200000 100000"}
    m = proc_cpu.machine_window(before, after, 2.0)
    assert m == {"cpus": 4, "busy_cores": 2.0, "idle_cores": 1.0, "iowait_cores": 0.0, "steal_cores": 1.0,
                 "cgroup": {"cpu_max": "200000 100000", "periods": 10, "throttled_periods": 6, "throttled_ms": 300.0}}
    assert proc_cpu.machine_line(m) == "machine: 2.0 of 4 cores busy, steal 1.0, 300.0 ms throttled (200000 100000)"
    with pytest.raises(ValueError, match="no aggregate 'cpu' line"):
        proc_cpu.parse_proc_stat("intr 1 2 3\n")


def test_a_variant_run_again_is_kept_apart():
    """--rounds: the first default run is `bare`, a variant its words; round 2 of each under its own key and log."""
    assert sp.variant_names([]) == (None, "")
    assert sp.variant_names(["--seed", "42"]) == ("--seed 42", "seed-42")
    assert sp.variant_names([], 2) == ("default #2", "default-r2")
    assert sp.variant_names(["--seed", "42"], 2) == ("--seed 42 #2", "seed-42-r2")


def test_engine_args_reach_trinitys_engine_config(tmp_path):
    """--engine-args lands in the serve config as Trinity's explorer.rollout_model.extra_engine_args, as Trinity's
    own config loader reads it (the dict its engine unpacks into AsyncEngineArgs), the report's keys unchanged."""
    from trinity.common.config import load_config

    import serve_vs_bare as svb

    cfg = svb.trinity_config(tmp_path / "serve.yaml", model=tmp_path, label="t", max_model_len=2048, gpu_util=0.6,
                             proxy_port=8010, ckpt=tmp_path / "ckpt", db_url=None)
    before = load_config(str(cfg))
    sp.with_engine_args(cfg, {"max_num_batched_tokens": 8192, "max_num_seqs": 1024})
    after = load_config(str(cfg))
    assert after.explorer.rollout_model.extra_engine_args == {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    assert before.explorer.rollout_model.extra_engine_args == {}
    assert after.explorer.proxy_port == before.explorer.proxy_port == 8010
    assert after.model.max_model_len == before.model.max_model_len == 2048


def test_a_process_gone_or_new_between_snapshots_is_left_out():
    a = proc_cpu.snapshot()
    child = subprocess.Popen([sys.executable, "-c", "sum(range(10**7))"])
    child.wait()
    b = proc_cpu.snapshot()
    assert child.pid not in {r["pid"] for r in proc_cpu.window(a, b, 1.0, top=10_000)}


def test_the_loop_window_counts_responses_and_latency(tmp_path):
    """The closed loop against the TEST DOUBLE: every response counted once, latencies, no errors."""
    double, url = po.start_double(tmp_path)
    try:
        w = sp.run_loop(url, "double", 4, SimpleNamespace(max_tokens=8, warmup_s=0.5, window_s=1.0), like_proxy=True)
        assert w["responses"] > 0 and w["errors"] == 0
        assert w["responses_per_s"] == pytest.approx(w["responses"] / w["wall_s"], rel=0.05)
        assert w["output_tokens_per_s"] == pytest.approx(8 * w["responses_per_s"], rel=0.05)
        assert 0 < w["latency_s"]["p50"] <= w["latency_s"]["p99"]
        assert w["processes"] and all(p["cpu_s"] > 0 for p in w["processes"])
        assert w["machine"]["busy_cores"] > 0 and "; machine: " in sp.summary_line(w)
        # no GPU driver on this machine: the real pynvml cannot load NVML, the window says so and goes on
        assert w["gpu"]["error"].startswith("NVML unavailable: ") and w["gpu"]["samples"] == 0
        assert w["gpu"]["period_s"] == 0.05  # bench/README.md: "polled every 50 ms"
        assert f"; gpu: {w['gpu']['error']}" in sp.summary_line(w)
    finally:
        po.stop(double)


def test_the_numeric_window_asks_for_numeric_logprobs(tmp_path):
    """--numeric's window: the loop's requests carry the mark, and the TEST DOUBLE (answering as the patched
    vLLM) returns the numbers, not the objects."""
    import json
    import urllib.request

    import loadgen

    double, url = po.start_double(tmp_path)
    try:
        body = loadgen.request_body("double", "hi", 5, temperature=1.0, like_proxy=loadgen.NUMERIC)
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            choice = json.loads(r.read())["choices"][0]
        assert choice["logprobs"] is None and len(choice["rftstack_logprobs"]) == 5 and len(choice["token_ids"]) == 5
        w = sp.run_loop(url, "double", 2, SimpleNamespace(max_tokens=5, warmup_s=0.3, window_s=0.5), like_proxy=loadgen.NUMERIC)
        assert w["responses"] > 0 and w["errors"] == 0
    finally:
        po.stop(double)


LOOP_IN_THREAD = r"""
import asyncio, threading, time
async def busy():
    while True:
        end = time.time() + 0.02
        while time.time() < end:
            sum(range(200))
        await asyncio.sleep(0.005)
def run():
    asyncio.run(busy())
threading.Thread(target=run, name="AsyncIO Thread: default", daemon=True).start()
print("go", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not shutil.which("py-spy") and not (Path(sys.executable).parent / "py-spy").exists(),
                    reason="py-spy is not installed (the dev group has it)")
def test_thread_profile_picks_the_event_loop_thread(tmp_path):
    """A real py-spy recording of a process whose asyncio loop runs in a named thread (as in a Ray async
    actor): the busy thread is that loop's, by tid and name, and its CPU per response is split by stage."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    child = subprocess.Popen([sys.executable, "-c", LOOP_IN_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "go"
        raw = tmp_path / "raw.txt"
        a = proc_cpu.snapshot()
        rec = sp.pp.py_spy_record([py_spy], child.pid, 2, 50, raw)
        b = proc_cpu.snapshot()
        if rec["rc"] != 0:
            pytest.skip(f"py-spy cannot attach here: {rec['stderr_tail']}")
        tid_cpu = {tid: (t[1] - a[child.pid]["threads"][tid][1]) / proc_cpu.TICK
                   for tid, t in b[child.pid]["threads"].items() if tid in a[child.pid]["threads"]}
        prof = sp.thread_profile(sp.pp.read_collapsed(raw.read_text()), tid_cpu, responses=100)
        loop = prof["loop_thread"]
        assert loop["name"] == "AsyncIO Thread: default" and loop["tid"] != child.pid
        assert loop["cpu_ms_per_response"] == pytest.approx(1000 * tid_cpu[loop["tid"]] / 100, rel=0.01)
        assert sum(loop["cpu_ms_per_response_by_stage"].values()) == pytest.approx(loop["cpu_ms_per_response"], rel=0.02)
        # the loop's coroutine is on every busy sample: its inclusive share is the whole thread's time
        incl = loop["top_inclusive_ms_per_response"]
        assert max(incl.values()) == pytest.approx(loop["cpu_ms_per_response"], rel=0.02)
        assert any(k.startswith("busy (") for k in incl) and incl[next(k for k in incl if k.startswith("busy ("))] > 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("argv, says", [
    (["--concurrency", "0"], "--concurrency"),
    (["--window-s", "0"], "must be positive"),
    (["--py-spy", "no-such-py-spy-here"], "py-spy is not available"),
    (["--rounds", "2"], "only with --bare"),
    (["--engine-args", "max_num_seqs=1024"], "--engine-args must be a JSON object"),
    (["--engine-args", "[1]"], "--engine-args must be a JSON object"),
    (["--bare", "--no-serve", "--engine-args", '{"max_num_seqs": 1024}'], "needs the serve"),
    (["--bare", "--rounds", "0"], "--rounds must be 1 or more"),
    (["--bare", "--bare-profile-requests", "plain,json"], "--bare-profile-requests names json"),
    (["--bare", "--bare-profile-requests", "plain,plain"], "--bare-profile-requests names none or one twice"),
])
def test_bad_input_is_one_sentence(tmp_path, argv, says):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "serve_profile.py"), "--model", str(tmp_path),
                        "--out", str(tmp_path / "o.json"), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


@pytest.mark.skipif(not shutil.which("py-spy") and not (Path(sys.executable).parent / "py-spy").exists(),
                    reason="py-spy is not installed (the dev group has it)")
def test_profile_targets_samples_each_named_process_under_load(tmp_path):
    """The serve's profile window, on this machine: a closed loop against the TEST DOUBLE upstream while py-spy
    records the processes named by command-line prefix (``*`` = anywhere): the double is found and profiled
    (its busiest thread, stages summing to its CPU per response), a name that matches nothing is reported.
    The double carries a name of this test's own on its command line: another double on the machine (a benchmark
    run beside the tests) once matched a bare ``*openai_double.py`` first."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    tag = f"profiled-{os.getpid()}-{tmp_path.name}"
    target = f"*--name {tag}"
    double, url = po.start_double(tmp_path, name=tag)
    try:
        args = SimpleNamespace(max_tokens=8, warmup_s=0.5, window_s=1.0, py_spy_s=2, rate=50)
        res = sp.profile_targets(url, "double", 4, args, [py_spy], tmp_path, [target, "ray::NoSuchActor"], "t")
        assert res["window"]["responses"] > 0 and res["window"]["errors"] == 0
        assert res["targets"]["ray::NoSuchActor"] == {"error": "no such process"}
        got = res["targets"][target]
        if got.get("error"):
            pytest.skip(f"py-spy cannot attach here: {got['py_spy']['stderr_tail']}")
        assert got["pid"] == double.pid
        loop = got["loop_thread"]
        assert loop["cpu_ms_per_response"] > 0
        assert sum(loop["cpu_ms_per_response_by_stage"].values()) == pytest.approx(loop["cpu_ms_per_response"], rel=0.02)
        assert (tmp_path / f"t---name-{tag}-c4.collapsed.gz").exists() and not list(tmp_path.glob("*.raw.txt"))
        # two result files in one folder, each with a serve labelled alike: each keeps its own stacks
        args.py_spy, args.levels = [py_spy], [4]
        for stem in ("anyio0", "anyio"):
            ph: dict = {}
            sp.profile_and_say(ph, url, "double", args, tmp_path / f"{stem}.json", [target], "serve", lambda: None)
            want = tmp_path / f"{stem}-serve---name-{tag}-c4.collapsed.gz"
            assert want.exists() and stack_frames.collapsed_path(tmp_path, ph["profile"], target, "4") == want
    finally:
        po.stop(double)


# session V (2026-12-04): host_session.sh engine3b engine3b-batch frontend3b-numeric-mpfork
V_RUNS = ("engine-args-qwen3b.json", "engine-batch-qwen3b.json", "frontend-qwen3b-numeric-mpfork.json")


def test_the_docs_table_of_session_v_is_what_its_result_files_hold():
    """docs/benchmarks.md's table of bare against Trinity's engine arguments is profile_table.py's output, with the
    variant named after host_session.sh's TRINITY_ENGINE_ARGS as that run used it."""
    import profile_table

    args = ENGINE_ARGS_SESSIONS_VW
    results = REPO / "bench" / "results" / "gpu-2026-12-04v"
    run = json.loads((results / V_RUNS[0]).read_text())
    assert args in run["bare_variants"] and f"{args} #2" in run["bare_variants"]
    table = profile_table.table([results / name for name in V_RUNS], {args: "bare with Trinity's engine arguments"})
    assert table in (REPO / "docs" / "benchmarks.md").read_text(), "docs/benchmarks.md should hold:\n" + table


def test_profile_table_bad_input_is_one_sentence(tmp_path):
    for argv, says in ((["--name", "no-equals-sign", str(tmp_path)], "should be VARIANT=LABEL"),
                       ([str(tmp_path / "none.json")], "no result file at")):
        r = subprocess.run([sys.executable, str(REPO / "bench" / "profile_table.py"), *argv], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bare_profile_windows_send_the_request_they_are_named_for(tmp_path):
    """--bare-profile-requests: each kind is the request loadgen sends (plain: no fields; fields: logprobs and
    token ids; numeric: with the numeric mark), and bare's targets include the mp executor's worker."""
    import loadgen

    bodies = {k: loadgen.request_body("m", "p", 4, temperature=1.0, like_proxy=v) for k, v in sp.PROFILE_REQUESTS.items()}
    assert "logprobs" not in bodies["plain"]
    assert bodies["fields"]["logprobs"] is True and "vllm_xargs" not in bodies["fields"]
    assert bodies["numeric"]["vllm_xargs"] == {"rftstack_logprobs_numeric": 1}
    assert "VLLM::Worker" in sp.BARE_TARGETS


def test_stack_frames_counts_another_profiled_process(tmp_path):
    """bench/stack_frames.py --process: the named process's stacks of each window that recorded it (session AN's real
    py-spy files), its samples a response counted from the file itself; a process no window recorded is one sentence
    and exit 2, and so is a result without profile windows."""
    import gzip

    results = REPO / "bench" / "results" / "gpu-2026-12-07an"
    res = json.loads((results / "engine-profile-qwen3b.json").read_text())
    got = stack_frames.rows(res, results / "stacks", ("MessageQueue.dequeue",), "64", "VLLM::Worker")
    assert [name for name, _, _ in got] == ["serve", "bare TRINITY_ENGINE_ARGS"]
    windows = [res["serve"]["profile"], next(iter(res["bare_variants"].values()))["profile_numeric"]]
    for (name, target, ms), prof in zip(got, windows):
        assert target == "VLLM::Worker"
        path = stack_frames.collapsed_path(results / "stacks", prof, target, "64")
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        samples = sum(int(ln.rsplit(" ", 1)[1]) for ln in lines)
        assert samples == sum(t["samples"] for t in prof["targets"][target]["threads"].values())
        assert ms["*"] == pytest.approx(1000 * samples / 100 / prof["window"]["responses"])  # --rate 100
        assert 0 < ms["MessageQueue.dequeue"] < ms["*"]
    frontends = stack_frames.rows(res, results / "stacks", ("MessageQueue.dequeue",), "64")
    assert [t for _, t, _ in frontends] == ["ray::vLLMRolloutModel", "*vllm serve"]  # without --process, as before
    for argv, says in (([str(results / "engine-profile-qwen3b.json"), str(results / "stacks"), "--process", "ray::Nope"],
                        "no profile window in this result profiled ray::Nope"),
                       ([str(results / "engine-fork0-qwen3b.json"), str(results / "stacks")],
                        "no profile window in this result profiled a frontend")):
        r = subprocess.run([sys.executable, str(REPO / "bench" / "stack_frames.py"), *argv], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
