"""bench/anyio_root.py: bad input is one sentence and exit 2; a short real run (its own loopback Ray head, the probe's
real Ray actor with the patch on and off, and the same server in a plain process on uvloop.run() as `vllm serve` runs
it; one round, without the warm-up runs, to keep CI's time) writes each server's results and their ratios; the rounds'
orders rotate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from anyio_root import round_order
from helpers import REPO

SCRIPT = REPO / "bench" / "anyio_root.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_bad_input_is_one_sentence(tmp_path):
    out = run("--out", str(tmp_path / "r.json"), "--rounds", "0")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "anyio_root: --rounds, --requests and --concurrency must be at least 1"]
    assert not (tmp_path / "r.json").exists()


def test_the_rounds_orders_rotate_so_each_server_goes_first_in_turn():
    assert [round_order(i) for i in range(4)] == [["on", "off", "plain"], ["off", "plain", "on"],
                                                  ["plain", "on", "off"], ["on", "off", "plain"]]


def test_a_short_run_compares_the_patch_on_and_off_and_a_plain_process(tmp_path):
    out = run("--out", str(tmp_path / "r.json"), "--rounds", "1", "--requests", "40", "--concurrency", "4",
              "--no-warm-up")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["warm_up"] is False and "warm-up" not in out.stdout
    assert [x["order"] for x in r["rounds"]] == [["on", "off", "plain"]]
    for x in r["rounds"]:
        assert (x["on"]["server"], x["off"]["server"], x["plain"]["server"]) == ("ray-actor", "ray-actor", "plain")
        assert x["on"]["switch"] is True and x["off"]["switch"] is False and x["plain"]["switch"] is False
        for name in ("on", "off", "plain"):
            assert x[name]["answered"] == 40 and x[name]["load"] == 0 and x[name]["loop_thread_ms_per_request"] > 0
            cpu, wall = x[name]["fixed_work_cpu_us"], x[name]["fixed_work_wall_us"]
            if x[name]["fixed_work_ticks"]:  # 40 requests may end within one 5 ms tick
                assert 0 < cpu <= wall * 1.05, x[name]
            else:
                assert cpu is None and wall is None, x[name]
        # upstream's code in the actor starts a thread for most background calls; in a plain process on uvloop.run()
        # the same code finds its root task and reuses its threads, as the patch makes the actor do
        assert x["off"]["threads"] > x["on"]["threads"] and x["off"]["threads"] > x["plain"]["threads"], x
        for a, b in (("on", "off"), ("on", "plain"), ("off", "plain")):
            assert x[f"ratio_{a}_{b}"] == round(x[a]["requests_per_s"] / x[b]["requests_per_s"], 3)
    assert "patch on / off" in out.stdout and "on / plain" in out.stdout
    assert all(f"median_fixed_work_cpu_us_{n}" in r for n in ("on", "off", "plain"))
