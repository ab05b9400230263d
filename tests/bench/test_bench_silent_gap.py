"""bench/silent_gap.py and bench/stack_sampler on a real server whose start-up has a known silent step.

The server (a real Python process) prints a line, spawns a multiprocessing child that spends 3 s in
a function named `quiet_setup` without printing, prints again and then answers HTTP. The tool must
find that one silent gap, name the child's `quiet_setup` frame from its samples, and leave nothing
running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from rftstack.doctor.netstat import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "silent_gap.py"

SERVER = textwrap.dedent(
    """
    import http.server, multiprocessing, sys, time

    def quiet_setup():
        t = time.time()
        while time.time() - t < 3.0:
            sum(range(1000))

    if __name__ == "__main__":
        print("starting", flush=True)
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=quiet_setup)
        p.start()
        p.join()
        print("set up", flush=True)

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_finds_the_silent_step_and_what_ran_in_it(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    port = free_port()
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--ready-url", f"http://127.0.0.1:{port}/", "--timeout", "60",
         "--min-gap", "2", "--", sys.executable, str(server), str(port)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "gaps.json").read_text())
    assert res["ready_s"] is not None and res["processes_sampled"] >= 2
    [gap] = [g for g in res["gaps"] if g["after_line"] == "starting"]
    assert gap["before_line"] == "set up" and 2.5 < gap["seconds"] < 10
    child = next(p for p in gap["processes"] if any("quiet_setup" in t["stack"] for t in p["top"]))
    assert child["samples"] >= 4 and "multiprocessing" in child["title"]
    # the server itself sat in Process.join during that time
    assert any("join" in t["stack"] for p in gap["processes"] if p["pid"] != child["pid"] for t in p["top"])
    assert "quiet_setup" in r.stdout
    # the same samples, read again: how long the child spent in quiet_setup
    a = subprocess.run([sys.executable, str(SCRIPT), "--analyze", str(out), "--time-in", r"srv\.py:\d+ quiet_setup|server\.py:\d+ quiet_setup"],
                       capture_output=True, text=True, timeout=60)
    assert a.returncode == 0, a.stderr
    [(pattern, [proc])] = json.loads((out / "time-in.json").read_text()).items()
    assert proc["pid"] == child["pid"] and 2.0 <= proc["wall_s"] <= 4.5, proc  # 3 s, +-1 interval (0.5 s) at each end
    # nothing left running: the server's group is gone
    time.sleep(0.5)
    pids = [int(f.stem) for f in (out / "stacks").glob("*.jsonl")]
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive = Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except ProcessLookupError:
            alive = False
        assert not alive, f"pid {pid} still running"


def test_no_command_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--ready-url", "http://127.0.0.1:9/"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no command given: put it after --" in r.stderr


def test_analyze_without_samples_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--analyze", str(tmp_path), "--time-in", "x"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"silent_gap: no stack samples under {tmp_path / 'stacks'}; give the --out directory of an earlier run")


def test_sampler_is_inert_without_its_variable(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "bench" / "stack_sampler"))
    env.pop("RFTSTACK_STACK_SAMPLES", None)
    r = subprocess.run([sys.executable, "-c", "import sys, threading; print(sys.modules['sitecustomize'].__file__, threading.active_count())"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and r.stdout.split()[1] == "1" and "stack_sampler" in r.stdout
