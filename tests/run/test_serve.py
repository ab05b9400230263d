"""`rftstack serve` supervising a real child (tests/doubles/fake_trinity.py stands in for trinity,
which needs a GPU) with real Ray heads: readiness, crash propagation, signals, timeouts, orphans."""

import importlib.util
import json
import os
import re
import shutil
import time
import signal
import sys
import urllib.error
import urllib.request

import pytest

from rftstack.doctor import netstat
from rftstack.run import serve
from rftstack.run import supervisor

from helpers import FAKE_TRINITY, ray_gcs_pid, rftstack_env, run_python, trinity_driver_pids

pytestmark = pytest.mark.slow


def write_config(tmp_path, model="/models/m", max_model_len=None, **explorer):
    cfg = tmp_path / "cfg.yaml"
    ex = "".join(f"\n  {k}: {v}" for k, v in explorer.items())
    mm = f"\n  max_model_len: {max_model_len}" if max_model_len else ""
    cfg.write_text(f"mode: serve\nmodel:\n  model_path: {model}{mm}\ncluster: {{node_num: 1, gpu_per_node: 1}}\nexplorer:{ex or ' {}'}\n")
    return str(cfg)


def join(head):
    return ["--skip-doctor", "--port", "0", "--ray-address", head.address, "--ray-token-path", head.token_path]


def assert_nothing_left(run):
    for tag in run.tags():
        assert supervisor.tagged(tag) == [], f"processes of {tag} left behind"


def test_serve_puts_back_the_signal_handlers_it_replaced(tmp_path):
    """serve handles SIGINT/SIGTERM itself while it runs, and the caller's handlers are back after it
    returns (here: a config that cannot be read, exit 2, after the run directory was made)."""
    code = """
        import signal, sys
        from rftstack import cli
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGINT, mine)
        signal.signal(signal.SIGTERM, mine)
        rc = cli.main(["serve", "-c", sys.argv[1], "--run-dir", sys.argv[2], "--skip-doctor"])
        print(rc, signal.getsignal(signal.SIGINT) is mine, signal.getsignal(signal.SIGTERM) is mine)
    """
    r = run_python(code, str(tmp_path / "absent.yaml"), str(tmp_path / "run"), timeout=120)
    assert r.stdout.split()[-3:] == ["2", "True", "True"], r.stdout + r.stderr
    assert (tmp_path / "run" / "status.json").is_file()


PHASE_RECORDER = """
    import json, os, signal, sys, threading
    from rftstack import cli
    from rftstack.run import rundir
    seen = []
    update = rundir.Status.update
    def record(self, **fields):
        phase = fields.get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
            if phase == "ready":
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        return update(self, **fields)
    rundir.Status.update = record
    rc = cli.main(sys.argv[1:])
    print(json.dumps({"rc": rc, "phases": seen}))
"""


def test_status_goes_through_every_phase_in_order(tmp_path, session_head):
    """status.json's phase takes every value of docs/serve.md's table, in order, for a serve that gets
    ready and is stopped by SIGINT (recorded inside the serve process as each update is written)."""
    env = rftstack_env(RFTSTACK_TRINITY_CMD=f"{sys.executable} {FAKE_TRINITY}", FAKE_TRINITY="",
                       FAKE_TRINITY_PIDS=str(tmp_path / "fake-pids.json"), XDG_CACHE_HOME=str(tmp_path / "cache"))  # fmt: skip
    r = run_python(PHASE_RECORDER, "serve", *join(session_head), "-c", write_config(tmp_path), "--run-dir", str(tmp_path / "run"),
                   env=env, timeout=240)  # fmt: skip
    assert r.stdout.strip(), r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out == {"rc": 0, "phases": ["preflight", "ray", "config", "trinity", "loading", "ready", "stopping", "stopped"]}, r.stdout + r.stderr
    # what the README shows of a serve that works
    assert "READY after " in r.stdout and ": OpenAI endpoint http://127.0.0.1:" in r.stdout and "try: curl -s http://127.0.0.1:" in r.stdout


def test_choose_port():
    taken = {8010, 9000}

    def free() -> int:
        return 12345

    assert serve.choose_port(None, None, taken.__contains__, free) == (12345, "trinity's default 8010 is in use; a free port")
    assert serve.choose_port(None, 9100, taken.__contains__, free)[0] == 9100
    assert serve.choose_port(0, 9100, taken.__contains__, free)[0] == 12345
    with pytest.raises(Exception, match="already in use"):
        serve.choose_port(9000, None, taken.__contains__, free)
    assert serve.choose_port(None, None, lambda p: False, free)[0] == 8010


def test_ready_then_sigint_stops_everything_including_escapees(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path), "--stop-timeout", "20"], fake="grandchildren,ignore_sigint,check_ray")
    ready = run.wait_event("ready", timeout=180)
    assert ready, run.finish() or run.stderr
    assert ready["endpoint"].startswith("http://127.0.0.1:")
    st = run.status()
    assert st["phase"] == "ready" and st["listen_address"] == "127.0.0.1" and st["trinity_pid"]
    pids = json.loads((tmp_path / "fake-pids.json").read_text())
    assert all(supervisor.alive(p) for p in pids["grandchildren"])
    # the fake read the effective config: its proxy is on loopback
    serving = [l for l in netstat.listeners() if l.port == st["proxy_port"]]
    assert serving and all(l.loopback for l in serving)
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.stderr
    assert "SIGINT, SIGTERM" in run.stderr  # the fake ignores SIGINT: serve escalated
    assert not supervisor.alive(pids["trinity"])
    assert not any(supervisor.alive(p) for p in pids["grandchildren"])  # also the one in its own session
    assert_nothing_left(run)
    assert run.status()["phase"] == "stopped" and run.status()["exit_code"] == 0
    assert session_head.gcs_pid() is not None  # a joined head is not ours to stop


def test_crash_after_ready_exits_nonzero_with_log_tail(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], fake="crash_after_ready")
    assert run.wait_event("ready", timeout=180)
    assert run.finish() == 1
    assert "trinity exited with code 3" in run.stderr
    assert "under a Ray head not started by this serve, so they are not watched" in run.stderr  # joined head
    assert "simulated engine crash" in run.stderr and "trinity.log" in run.stderr
    st = run.status()
    assert st["phase"] == "failed" and st["exit_code"] == 1 and "code 3" in st["exit_reason"]
    assert_nothing_left(run)


def test_engine_process_death_ends_the_serve(tmp_path, serve_runner):
    """Trinity's proxy keeps answering /health when its vLLM engine dies (seen on the H200); serve
    watches the processes vLLM titles VLLM::* under its own Ray head (here a Ray actor's child with
    that title, as Trinity's engine actor has) and ends."""
    import os
    import signal

    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "-c", write_config(tmp_path)], fake="engine_child")
    assert run.wait_event("ready", timeout=400), run.stderr_text()[-3000:]
    pids = json.loads((tmp_path / "fake-pids.json").read_text())
    assert "VLLM::EngineCore (pid %d)" % pids["engine"] in run.stderr_text()
    os.kill(pids["engine"], signal.SIGKILL)
    assert run.finish() == 1
    assert f"the vLLM engine's process VLLM::EngineCore (pid {pids['engine']}) exited while serving, so requests can no longer be answered" in run.stderr
    st = run.status()
    assert st["phase"] == "failed" and st["exit_code"] == 1 and "VLLM::EngineCore" in st["exit_reason"]
    assert not supervisor.alive(pids["trinity"])
    assert_nothing_left(run)


def test_exit_at_start_and_ready_timeout(tmp_path, session_head, serve_runner):
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path)], fake="exit_at_start")
    assert run.finish() == 1
    assert "trinity exited with code 4" in run.stderr and "simulated start-up failure" in run.stderr
    run = serve_runner([*join(session_head), "-c", write_config(tmp_path), "--ready-timeout", "6", "--stop-timeout", "4"],
                       fake="never_ready,ignore_sigterm,grandchildren")  # fmt: skip
    assert run.finish() == 1
    assert "was not ready after 6 s" in run.stderr
    assert "SIGINT, SIGTERM, SIGKILL" in run.stderr
    assert_nothing_left(run)


def test_bad_input_is_one_sentence_and_starts_nothing(tmp_path, serve_runner):
    run = serve_runner(["--skip-doctor", "-c", str(tmp_path / "missing.yaml")])
    assert run.finish(timeout=60) == 2
    assert "cannot read the config" in run.stderr and "Traceback" not in run.stderr
    assert run.status()["phase"] == "failed"
    (tmp_path / "bad.yaml").write_text("mode: train\nmodel: {model_path: /m}\n")
    run = serve_runner(["--skip-doctor", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent", "-c", str(tmp_path / "bad.yaml")])
    assert run.finish(timeout=60) == 2
    assert "mode: serve" in run.stderr and "Traceback" not in run.stderr
    run = serve_runner(["--skip-doctor", "--dashboard", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent", "-c", write_config(tmp_path)])
    assert run.finish(timeout=60) == 2
    assert "--dashboard starts Ray's dashboard with this serve's own Ray head; leave out --ray-address" in run.stderr
    assert "Traceback" not in run.stderr and run.status()["phase"] == "failed"


def test_preflight_failure_stops_the_head_and_starts_nothing_else(tmp_path, tiny_model, serve_runner):
    """Without --skip-doctor the real doctor runs; on this CPU-only machine it finds no NVIDIA
    driver (a FAIL) among the machine checks, so serve stops there with the doctor's sentence and
    exit 1, no trinity: the own Ray head and Trinity's config subprocess (the slow step), which
    start beside the machine checks, are stopped at once (the head's temp dir removed, the
    subprocess unread); nothing is left, in a few seconds (it was 19 s with the config checks and
    the head start waited for)."""
    if importlib.util.find_spec("rftstack.doctor.collect") is None:
        run = serve_runner(["-c", write_config(tmp_path)])
        assert run.finish(timeout=60) == 2
        assert "--skip-doctor" in run.stderr and "rftstack.doctor.collect" in run.stderr
        return
    if shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present: the preflight has no reason to fail here")
    t0 = time.monotonic()
    run = serve_runner(["--port", "0", "-c", write_config(tmp_path, model=tiny_model, max_model_len=2048)])
    assert run.finish(timeout=300) == 1
    took = time.monotonic() - t0
    assert "preflight failed" in run.stderr and "gpu.driver" in run.stderr
    assert "Trinity's own config check started" in run.stderr
    assert "checking the config with Trinity" not in run.stderr and "config.trinity" not in run.stderr
    # the head started beside the machine checks (before their findings were printed), then was
    # stopped: during its `ray start` (not waited for) or, on a quick machine, after it
    lines = run.stderr.splitlines()
    started = next(i for i, line in enumerate(lines) if "starting Ray head" in line)
    assert started < next(i for i, line in enumerate(lines) if "gpu.driver" in line), run.stderr
    assert "no dashboard" in lines[started]
    assert "Ray head start stopped before it returned" in run.stderr or "Ray head stopped" in run.stderr, run.stderr
    temp_dir = re.search(r"temp dir (/\S+)\)", lines[started]).group(1)
    assert not os.path.exists(temp_dir), temp_dir
    assert run.status()["ray"]["tag"] in run.tags()
    assert (run.run_dir / "config.preflight.yaml").exists()
    assert not (run.run_dir / "ray").exists() and not (run.run_dir / "logs" / "trinity.log").exists()
    assert run.status()["phase"] == "failed"
    assert took < 15, took
    assert_nothing_left(run)


def dashboard_processes(ray_tag: str) -> list[str]:
    """The command lines of the head's dashboard process (Ray 2.60 starts one in every case)."""
    return [p.cmdline for p in supervisor.tagged(ray_tag) if "/dashboard/dashboard.py" in p.cmdline]


def test_own_head_is_loopback_only_and_ray_death_stops_trinity(tmp_path, serve_runner):
    """Also: serve's own head runs no Ray dashboard by default, and says so (status.json, the
    ready event, the progress line). Upstream behaviour of Ray 2.60: with `--include-dashboard=false`
    it still starts its dashboard process, without the web frontend and with only the usage-stats
    module; its HTTP port is not opened."""
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "-c", write_config(tmp_path)], fake="check_ray,grandchildren")
    ready = run.wait_event("ready", timeout=400)
    assert ready, (run.finish(), run.stderr)
    st = run.status()
    serve_tag, ray_tag = st["tag"], st["ray"]["tag"]
    assert ready["dashboard"] is None and st["ray"]["dashboard"] is None
    [minimal] = dashboard_processes(ray_tag)
    assert "--disable-frontend" in minimal and "--modules-to-load=UsageStatsHead " in minimal + " "
    assert st["ray"]["ports"]["dashboard"] not in {l.port for l in netstat.listeners()}
    assert "no Ray dashboard (--dashboard starts one)" in run.stderr_text()
    # every listening socket of the whole serve (Ray head, its workers, trinity and children)
    by_inode = {l.inode: l for l in netstat.listeners()}
    socks = [(p.pid, p.cmdline[:50], by_inode[i]) for tag in (serve_tag, ray_tag) for p in supervisor.tagged(tag)
             for i in netstat.socket_inodes(p.pid) if i in by_inode]  # fmt: skip
    assert len(socks) >= 5
    assert [(pid, cmd, l.address, l.port) for pid, cmd, l in socks if not l.loopback] == []
    assert (tmp_path / "run0" / "ray").is_symlink() and (tmp_path / "run0" / "logs" / "ray-start.log").exists()
    # Trinity's explorer (the proxy) is pinned to this serve's own head (trinity-explorer-node.patch)
    assert "env: RFTSTACK_EXPLORER_NODE=127.0.0.1: Trinity's explorer (the proxy) runs on this machine's Ray node" in (tmp_path / "run0" / "logs" / "serve.log").read_text()
    gcs = [p.pid for p in supervisor.tagged(ray_tag) if "gcs_server" in p.cmdline]
    assert len(gcs) == 1
    os.kill(gcs[0], signal.SIGKILL)
    assert run.finish() == 1
    assert "GCS died" in run.stderr
    assert "GCS died" in run.status()["exit_reason"]
    assert supervisor.tagged(serve_tag) == [] and supervisor.tagged(ray_tag) == []


def test_expose_opens_the_proxy_alone_beyond_loopback(tmp_path, serve_runner):
    """With --expose every socket of the run (Ray head, its workers, trinity and children) still
    listens on loopback, except the proxy's; TEST DOUBLE for Trinity (fake_trinity listens where
    the effective config's explorer.listen_address says, as Trinity's proxy does)."""
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "--expose", "-c", write_config(tmp_path)])
    ready = run.wait_event("ready", timeout=400)
    assert ready, (run.finish(), run.stderr)
    st = run.status()
    by_inode = {l.inode: l for l in netstat.listeners()}
    socks = [(p.pid, p.cmdline[:50], by_inode[i]) for tag in (st["tag"], st["ray"]["tag"]) for p in supervisor.tagged(tag)
             for i in netstat.socket_inodes(p.pid) if i in by_inode]  # fmt: skip
    assert len(socks) >= 5
    outside = {(l.address, l.port) for _, _, l in socks if not l.loopback}
    assert outside == {("0.0.0.0", st["proxy_port"])}, socks
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.stderr


def test_own_head_sigterm_and_dashboard_flag(tmp_path, serve_runner):
    """With --dashboard the own head runs Ray's dashboard on loopback, its URL in the ready event and
    status.json, its HTTP API refusing a request without the head's token."""
    run = serve_runner(["--skip-doctor", "--dashboard", "--port", "0", "--num-gpus", "0", "-c", write_config(tmp_path)])
    ready = run.wait_event("ready", timeout=400)
    assert ready, (run.finish(), run.stderr)
    st = run.status()
    port = st["ray"]["ports"]["dashboard"]
    assert ready["dashboard"] == st["ray"]["dashboard"] == f"http://127.0.0.1:{port}"
    [full] = dashboard_processes(st["ray"]["tag"])
    assert "--disable-frontend" not in full and "--modules-to-load" not in full
    assert {(l.address, l.port) for l in netstat.listeners() if l.port == port} == {("127.0.0.1", port)}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(ready["dashboard"] + "/api/version", timeout=10)
    assert refused.value.code == 401
    tags = run.tags()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.stderr
    assert "Ray head stopped (SIGTERM, " in run.stderr, run.stderr  # its GCS server left on SIGTERM, no SIGKILL
    for tag in tags:
        assert supervisor.tagged(tag) == []


OVERLAP_RECORDER = """
    import json, os, signal, sys, threading
    sys.path.insert(0, sys.argv.pop(1))  # tests/doubles
    import h200_driver
    from rftstack import cli
    from rftstack.doctor.checks import config, gpu
    from rftstack.run import ray_head, rundir, serve, supervisor
    gpu.read = h200_driver.read  # TEST DOUBLE: the doctor sees an H200 host's driver (this machine has none)
    events, lock = [], threading.Lock()
    flags = {k: threading.Event() for k in ("ray start", "trinity spawned", "ready", "driver check done")}
    phase = {"now": None}
    def note(what):
        with lock:
            events.append(what)
    def waits_for(flag, what, fn):
        # each step waits until the one it must overlap has begun: a serial runner makes it wait in vain
        def wrapped(*a, **k):
            note(what + " begins")
            note(what + (" saw " if flags[flag].wait(60) else " waited in vain for ") + flag)
            try:
                return fn(*a, **k)
            finally:
                flags.get(what + " done", threading.Event()).set()
        return wrapped
    def stop_when_ready():  # SIGINT once ready and the driver check is over
        flags["ready"].wait(300); flags["driver check done"].wait(60); os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=stop_when_ready, daemon=True).start()
    launch, spawn, preflight, update, sleep = ray_head.launch, supervisor.spawn, serve.Serve._preflight, rundir.Status.update, serve.time.sleep
    def launch_rec(*a, **k):
        note("ray start"); flags["ray start"].set()
        return launch(*a, **k)
    def spawn_rec(*a, **k):
        note("trinity spawned"); flags["trinity spawned"].set()
        return spawn(*a, **k)
    def preflight_rec(self, config_path, probe=None):
        if config_path is None:
            waits_for("ray start", "machine checks", lambda: preflight(self, config_path))()
            note("machine checks end"); return
        preflight(self, config_path, probe); note("config checks end")
    def update_rec(self, **fields):
        phase["now"] = fields.get("phase", phase["now"])
        if fields.get("phase") == "ready":
            flags["ready"].set()
        return update(self, **fields)
    loading_sleeps = []
    def sleep_rec(s):
        if phase["now"] == "loading" and threading.current_thread() is threading.main_thread():
            loading_sleeps.append(s)
        return sleep(s)
    probe_init, run_probe = config.Probe.__init__, config.run_probe
    def probe_init_rec(self, *a, **k):
        note("config probe starts"); return probe_init(self, *a, **k)
    def run_probe_rec(*a, **k):
        note("config probe runs again"); return run_probe(*a, **k)
    config.Probe.__init__, config.run_probe = probe_init_rec, run_probe_rec
    ray_head.launch, supervisor.spawn, serve.Serve._preflight, rundir.Status.update = launch_rec, spawn_rec, preflight_rec, update_rec
    serve.time.sleep = sleep_rec
    ray_head.probe = waits_for("trinity spawned", "driver check", ray_head.probe)
    rc = cli.main(sys.argv[1:])
    print(json.dumps({"rc": rc, "events": events, "loading_sleeps": sorted(set(loading_sleeps))}))
"""


def test_preflight_head_and_driver_check_overlap_by_event_order(tmp_path, tiny_model):
    """The runner's own start-up, by the order of its steps (not by timing): the own Ray head's
    `ray start` and Trinity's own config check (a subprocess, seconds) begin at once, beside the
    machine checks, and the config checks read that subprocess's answer (none runs again); trinity
    is started without waiting for the head's driver check, which runs beside it; the loading phase
    asks the proxy every READY_POLL_S. Each step waits up to 60 s for the one it must overlap, so a
    runner that does them one after another fails here. The doctor's GPU reader is the TEST DOUBLE
    tests/doubles/h200_driver.py (no driver here)."""
    env = rftstack_env(RFTSTACK_TRINITY_CMD=f"{sys.executable} {FAKE_TRINITY}", FAKE_TRINITY="check_ray",
                       XDG_CACHE_HOME=str(tmp_path / "cache"))  # fmt: skip
    cfg = write_config(tmp_path, model=tiny_model, max_model_len=2048)
    r = run_python(OVERLAP_RECORDER, str(FAKE_TRINITY.parent), "serve", "-c", cfg, "--port", "0", "--num-gpus", "1",
                   "--run-dir", str(tmp_path / "run"), env=env, timeout=400)  # fmt: skip
    assert r.stdout.strip(), r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    ev = out["events"]
    assert out["rc"] == 0, r.stdout[-3000:]
    assert not [e for e in ev if "in vain" in e], ev
    assert ev.index("ray start") < ev.index("machine checks end") < ev.index("config checks end") < ev.index("trinity spawned")
    assert ev.index("config probe starts") < ev.index("machine checks begins") and "config probe runs again" not in ev
    assert "machine checks saw ray start" in ev and "driver check saw trinity spawned" in ev
    assert out["loading_sleeps"] and max(out["loading_sleeps"]) <= serve.READY_POLL_S <= 0.1
    assert "Ray head answered a driver at 127.0.0.1:" in r.stdout


def test_ready_poll_is_short_and_dead_checks_are_not():
    """The endpoint is printed at most READY_POLL_S after the proxy answers (it was up to 1 s); the
    walk over /proc for dead processes stays at DEAD_CHECK_EVERY_S."""
    assert serve.READY_POLL_S <= 0.1
    assert serve.DEAD_CHECK_EVERY_S >= 1.0


REFUSING_HEAD = """
    import sys
    from rftstack import cli
    from rftstack.run import ray_head
    probe = ray_head.probe
    def wrong_token(address, env, timeout=90):
        # a real driver with a token the head does not know (as after a head restarted with a new one)
        open(sys.argv[1], "w").write("0" * 64)
        return probe(address, {**env, "RAY_AUTH_TOKEN_PATH": sys.argv[1]}, timeout=8)
    ray_head.probe = wrong_token
    sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_head_that_refuses_a_driver_ends_the_serve(tmp_path):
    """The own head's driver check runs beside trinity's start; when the head refuses a real driver
    (here: a wrong token), serve ends with the check's one sentence, exit 2 as when it waited for
    the check, and nothing is left running."""
    env = rftstack_env(RFTSTACK_TRINITY_CMD=f"{sys.executable} {FAKE_TRINITY}", FAKE_TRINITY="never_ready",
                       XDG_CACHE_HOME=str(tmp_path / "cache"))  # fmt: skip
    run_dir = tmp_path / "run"
    r = run_python(REFUSING_HEAD, str(tmp_path / "wrong-token"), "serve", "--skip-doctor", "--port", "0", "--num-gpus", "0",
                   "-c", write_config(tmp_path), "--run-dir", str(run_dir), "--ready-timeout", "120", env=env, timeout=300)  # fmt: skip
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
    assert "did not answer within 8 s" in r.stdout or "refused a driver" in r.stdout, r.stdout[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    st = json.loads((run_dir / "status.json").read_text())
    assert st["phase"] == "failed" and st["exit_code"] == 2
    assert supervisor.tagged(st["tag"]) == [] and supervisor.tagged(st["ray"]["tag"]) == []


def test_kill9_of_trinity_ends_the_serve_with_its_code(tmp_path, serve_runner):
    """kill -9 of the `trinity run` process (found by its command line among the serve's tagged
    processes, as tests/gpu/test_faults_gpu.py finds the real one): serve exits 1 with `trinity
    exited with code -9`, and stops its own Ray head, whose GCS the same helpers find."""
    run = serve_runner(["--skip-doctor", "--port", "0", "--num-gpus", "0", "-c", write_config(tmp_path)], fake="check_ray,grandchildren")
    assert run.wait_event("ready", timeout=400), (run.finish(), run.stderr)
    st = run.status()
    pids = json.loads((tmp_path / "fake-pids.json").read_text())
    assert trinity_driver_pids(st["tag"]) == [st["trinity_pid"]] == [pids["trinity"]]
    gcs = ray_gcs_pid(st["ray"]["tag"])
    assert gcs and "gcs_server" in supervisor.read_proc(gcs).cmdline
    os.kill(st["trinity_pid"], signal.SIGKILL)
    assert run.finish() == 1
    assert "FAILED: trinity exited with code -9" in run.stderr
    assert run.status()["exit_reason"] == "trinity exited with code -9" and run.status()["phase"] == "failed"
    assert not supervisor.alive(gcs)
    assert_nothing_left(run)
