"""ray_head: pure decisions, and a real head: loopback-only sockets, token required, clean stop."""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from rftstack.doctor import netstat
from rftstack.run import ray_head
from rftstack.run import supervisor
from rftstack.errors import UserError

from helpers import rftstack_env


def test_gpu_count():
    smi = ["GPU 0: NVIDIA H200 (UUID: GPU-1)", "GPU 1: NVIDIA H200 (UUID: GPU-2)", "  MIG 1g.18gb Device 0"]
    assert ray_head.gpu_count(None, smi) == 2
    assert ray_head.gpu_count("0", smi) == 1
    assert ray_head.gpu_count("", smi) == 0
    assert ray_head.gpu_count("-1", smi) == 0
    assert ray_head.gpu_count(None, None) == 0


def test_head_argv_names_every_port_and_loopback():
    ports = dict(zip(ray_head.PORT_NAMES, range(20000, 20000 + len(ray_head.PORT_NAMES))))
    argv = ray_head.head_argv("ray", ports, "/tmp/x", 1, None)
    assert "--node-ip-address=127.0.0.1" in argv and "--dashboard-host=127.0.0.1" in argv and "--disable-usage-stats" in argv
    env = ray_head.head_env(ports, "/tok", "tag")
    named = " ".join(argv) + " " + " ".join(env.values())
    assert all(str(p) in named for p in ports.values())
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"  # no upload of the run directory under `uv run`
    assert int(env["RAY_ROTATION_MAX_BYTES"]) * (1 + int(env["RAY_ROTATION_BACKUP_COUNT"])) <= 512 * 1024 * 1024


def head_listeners(tag):
    by_inode = {l.inode: l for l in netstat.listeners()}
    out = []
    for p in supervisor.tagged(tag):
        out += [(p.pid, p.cmdline[:60], by_inode[i]) for i in netstat.socket_inodes(p.pid) if i in by_inode]
    return out


@pytest.mark.slow
def test_real_head_loopback_token_already_running_and_stop(tmp_path):
    state = tmp_path / "state"
    cli = [sys.executable, "-m", "rftstack", "ray-head", "--state-dir", str(state), "--num-cpus", "1", "--num-gpus", "0", "--json"]
    env = rftstack_env(HOME=str(tmp_path))  # no ~/.ray/auth_token can help a client
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout)
    head = ray_head.Head(**{k: info[k] for k in ("address", "ports", "temp_dir", "token_path", "tag", "num_gpus", "started_at", "dashboard_url", "resources")})
    try:
        assert info["resources"]["CPU"] == 1.0
        # every listening socket of every head process is on loopback
        socks = head_listeners(head.tag)
        assert socks, "the head's processes hold no listening sockets?"
        outside = [(pid, cmd, l.address, l.port) for pid, cmd, l in socks if not l.loopback]
        assert outside == []
        assert head.ports["gcs"] in {l.port for _, _, l in socks}
        assert head.ports["dashboard"] in {l.port for _, _, l in socks}
        # the token file is private
        assert (state / "auth_token").stat().st_mode & 0o077 == 0

        # a driver with the token connects; one without it is refused by the GCS
        assert ray_head.probe(head.address, {**env, **head.env()})["CPU"] == 1.0
        no_token = {**env, **head.env(), "RAY_AUTH_MODE": "disabled"}
        no_token.pop("RAY_AUTH_TOKEN_PATH")
        wrong = tmp_path / "wrong_token"
        wrong.write_text("0" * 64)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # each refusal is Ray's ~20 s of retries: side by side
            refusals = [pool.submit(ray_head.probe, head.address, bad_env, timeout=120)
                        for bad_env in (no_token, {**env, **head.env(), "RAY_AUTH_TOKEN_PATH": str(wrong)})]  # fmt: skip
            for refusal in refusals:
                with pytest.raises(UserError, match="refused"):
                    refusal.result()
        # the dashboard's HTTP API wants the token too
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(head.dashboard_url + "/api/version", timeout=10)
        assert exc.value.code == 401
        req = urllib.request.Request(head.dashboard_url + "/api/version", headers={"Authorization": "Bearer " + open(head.token_path).read()})
        assert urllib.request.urlopen(req, timeout=10).status == 200

        # a second start reports the running head instead of starting another
        again = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0
        assert json.loads(again.stdout)["already_running"] is True
        assert json.loads(again.stdout)["address"] == head.address

        stop = subprocess.run(cli[:4] + ["stop", "--state-dir", str(state), "--json"], env=env, capture_output=True, text=True, timeout=120)
        # no SIGKILL needed: the GCS server is stopped after its clients (ray_head.stop)
        assert stop.returncode == 0 and json.loads(stop.stdout) == {"stopped": True, "signals": ["SIGTERM"], "left": []}
        assert supervisor.tagged(head.tag) == []
        status = subprocess.run(cli[:4] + ["status", "--state-dir", str(state), "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 1 and json.loads(status.stdout) == {"running": False}
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)


@pytest.mark.slow
def test_block_runs_in_the_foreground_until_sigint(tmp_path):
    import signal

    cli = [sys.executable, "-m", "rftstack", "ray-head", "--block", "--state-dir", str(tmp_path), "--num-cpus", "1", "--num-gpus", "0", "--json"]
    proc = subprocess.Popen(cli, env=rftstack_env(HOME=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = None
    try:
        info = json.loads(proc.stdout.readline())
        tag = info["tag"]
        assert supervisor.tagged(tag)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        assert supervisor.tagged(tag) == []
        assert not (tmp_path / "head.json").exists()
    finally:
        proc.kill()
        proc.communicate()
        if tag:
            supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)


def test_head_without_the_driver_wait_answers_a_driver_at_once(tmp_path):
    """``start(driver_check=False)`` (serve's head) returns after `ray start` alone. That is enough
    because of an upstream behaviour of Ray 2.60 (`ray start` returns only once its node.py has
    found the new node registered in the GCS, over the token-checked client): a real driver then
    connects at once, as DriverCheck (what serve runs beside trinity's start) shows."""
    said: list[str] = []
    head = ray_head.start(state_dir=tmp_path / "head", num_gpus=1, num_cpus=1, driver_check=False, progress=said.append)
    try:
        assert head.resources == {} and not [m for m in said if "answers" in m]
        assert "a driver's connection is tried in the background" in said[-1]
        check = ray_head.DriverCheck(head, progress=said.append)
        check.thread.join(120)
        assert check.failure() is None, check.failure()
        assert head.resources["GPU"] == 1.0 and head.resources["CPU"] == 1.0
        assert said[-1].startswith(f"Ray head answered a driver at {head.address}")
    finally:
        ray_head.stop(head, timeout=2, remove_temp=True)


def test_head_argv_without_dashboard():
    """serve's own head (dashboard=False) asks Ray for no dashboard and names no dashboard address."""
    ports = dict(zip(ray_head.PORT_NAMES, range(20000, 20000 + len(ray_head.PORT_NAMES))))
    argv = ray_head.head_argv("ray", ports, "/tmp/x", 1, None, dashboard=False)
    assert "--include-dashboard=false" in argv
    assert not [a for a in argv if a.startswith(("--dashboard-host", "--dashboard-port"))]
    assert "--include-dashboard=false" not in ray_head.head_argv("ray", ports, "/tmp/x", 1, None)


def test_cancel_stops_ray_start_and_removes_its_temp_dir(tmp_path):
    """A start whose caller gives up (serve's preflight failed while `ray start` ran) is not waited
    for: `ray start` and what it started are stopped, the temp dir removed, no retry."""
    import threading

    cancel = threading.Event()
    said: list[str] = []

    def give_up_once_started():
        while not [m for m in said if m.startswith("starting Ray head")]:
            time.sleep(0.01)
        time.sleep(0.3)  # `ray start` is running (it takes seconds)
        cancel.set()

    threading.Thread(target=give_up_once_started, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(ray_head.Cancelled) as cancelled:
        ray_head.start(state_dir=tmp_path / "head", num_gpus=0, num_cpus=1, driver_check=False, dashboard=False,
                       progress=said.append, cancel=cancel)  # fmt: skip
    node = cancelled.value.node
    assert time.monotonic() - t0 < 15
    assert not [m for m in said if "retrying" in m or "processes up" in m], said
    assert not os.path.exists(node.temp_dir)
    assert supervisor.tagged(node.tag) == []
