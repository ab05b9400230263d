"""supervisor: tags, process groups and escalating teardown, with real processes."""

import os
import signal
import subprocess
import sys
import uuid

from rftstack.run import supervisor

CHILD = r"""
import os, signal, subprocess, sys, time
mode = sys.argv[1]
if "ignore_int" in mode:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if "ignore_term" in mode:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
a = subprocess.Popen(["sleep", "300"])
b = subprocess.Popen(["sleep", "300"], start_new_session=True)  # escapes the process group
print(a.pid, b.pid, flush=True)
time.sleep(300)
"""


def _start(mode: str, tag: str):
    env = {**os.environ, supervisor.TAG_VAR: tag}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    a, b = map(int, proc.stdout.readline().split())
    return proc, a, b


def test_stop_reaches_group_and_escapees_by_tag():
    tag = f"t-{uuid.uuid4().hex}"
    proc, a, b = _start("plain", tag)
    try:
        found = {p.pid for p in supervisor.tagged(tag)}
        assert {proc.pid, a, b} <= found
        res = supervisor.stop(tag=tag, pgid=proc.pid, first=signal.SIGINT, grace_s=20, term_s=20, keep_reaping=[proc.pid], leader=proc.pid)
        assert res.left == []
        assert res.signals[0] == "SIGINT"
        assert not supervisor.alive(a) and not supervisor.alive(b)
        assert supervisor.tagged(tag) == []
    finally:
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)
        proc.wait(timeout=10)


def test_stop_escalates_to_sigkill_when_signals_are_ignored():
    tag = f"t-{uuid.uuid4().hex}"
    proc, a, b = _start("ignore_term", tag)
    try:
        res = supervisor.stop(tag=tag, pgid=proc.pid, first=signal.SIGINT, grace_s=1, term_s=1, keep_reaping=[proc.pid], leader=proc.pid)
        assert res.signals == ["SIGINT", "SIGTERM", "SIGKILL"]
        assert res.left == []
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)


def test_untagged_processes_are_not_touched():
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        assert supervisor.tagged(f"t-{uuid.uuid4().hex}") == []
        res = supervisor.stop(tag=f"t-{uuid.uuid4().hex}", first=signal.SIGKILL)
        assert res.signals == [] and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_read_proc_handles_spaces_in_command_names():
    info = supervisor.read_proc(os.getpid())
    assert info.pid == os.getpid() and info.ppid == os.getppid() and info.state in "RS"
    assert supervisor.read_proc(2**22 + 12345) is None


def test_line_pump_keeps_the_tail():
    lines = []
    proc, pump = supervisor.spawn([sys.executable, "-c", "for i in range(300): print('line', i)"], env=dict(os.environ), sink=lines.append)
    proc.wait(timeout=30)
    pump.join(timeout=10)
    assert lines[-1] == "line 299" and len(lines) == 300
    assert pump.tail(2) == ["line 298", "line 299"]
    assert len(pump.lines) == 200


def test_hurry_ends_the_grace_periods():
    tag = f"t-{uuid.uuid4().hex}"
    proc, a, b = _start("ignore_term", tag)
    try:
        res = supervisor.stop(tag=tag, pgid=proc.pid, first=signal.SIGINT, grace_s=3600, term_s=3600,
                              keep_reaping=[proc.pid], leader=proc.pid, hurry=lambda: True)  # fmt: skip
        assert res.signals == ["SIGINT", "SIGTERM", "SIGKILL"] and res.left == []
    finally:
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)
        proc.wait(timeout=10)


RETITLED = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); print(flush=True); time.sleep(300)"],
    stdout=subprocess.PIPE)
child.stdout.readline()  # retitled now
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_retitled_child_whose_environment_hides_the_tag_is_found_through_its_parent():
    """setproctitle (vLLM's VLLM::EngineCore, VLLM::Worker) overwrites what /proc/PID/environ shows,
    so the child's own tag cannot be read: it is found as a descendant of its tagged parent."""
    tag = f"t-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", RETITLED], env={**os.environ, supervisor.TAG_VAR: tag},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        child = int(proc.stdout.readline())
        assert not supervisor.has_tag(child, tag), "the title should hide the child's environment"
        assert supervisor.has_tag(proc.pid, tag)
        assert child in {p.pid for p in supervisor.tagged(tag)}
        assert supervisor.engine_processes(tag) == {child: "VLLM::EngineCore"}
    finally:
        supervisor.stop(tag=tag, pgid=proc.pid, first=signal.SIGKILL, grace_s=5)
        proc.wait(timeout=10)


ESCAPEE = r"""
import signal, subprocess, sys, time
code = ("import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "def term(signum, frame):\n"
        "    open(sys.argv[1], 'w').write(signal.Signals(signum).name)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print(flush=True)\n"
        "time.sleep(300)\n")
esc = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], start_new_session=True, stdout=subprocess.PIPE)
esc.stdout.readline()  # its handlers are set
print(esc.pid, flush=True)
time.sleep(300)
"""


def test_an_escaped_process_gets_sigterm_before_sigkill(tmp_path):
    """The leader dies of the first signal; a tagged process in its own session ignores SIGINT and
    must get SIGTERM (a chance to clean up) once the leader is gone, not SIGKILL."""
    tag = f"t-{uuid.uuid4().hex}"
    got = tmp_path / "escapee-got"
    proc = subprocess.Popen([sys.executable, "-c", ESCAPEE, str(got)], env={**os.environ, supervisor.TAG_VAR: tag},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        escapee = int(proc.stdout.readline())
        res = supervisor.stop(tag=tag, pgid=proc.pid, first=signal.SIGINT, grace_s=20, term_s=20, keep_reaping=[proc.pid], leader=proc.pid)
        assert res.signals == ["SIGINT", "SIGTERM"] and res.left == []
        assert got.read_text() == "SIGTERM"
        assert not supervisor.alive(escapee)
    finally:
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)
        proc.wait(timeout=10)


SERVER = r"""
import os, signal, sys, time
client, out = int(sys.argv[1]), sys.argv[2]
def on_term(*_):
    with open(out, "w") as f:
        f.write("client alive" if os.path.exists(f"/proc/{client}") and open(f"/proc/{client}/stat").read().split(") ")[1][0] != "Z" else "client gone")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(300)
"""


def test_a_last_process_gets_the_signal_only_after_the_others_are_gone(tmp_path):
    """What ray_head.stop relies on for the GCS server: the process that ``last`` names is
    signalled once the other tagged processes have left, not beside them."""
    tag = f"t-{uuid.uuid4().hex}"
    env = {**os.environ, supervisor.TAG_VAR: tag}
    # the client takes a second to leave after SIGTERM, as raylet does
    client = subprocess.Popen([sys.executable, "-c", "import signal,sys,time\n"
                               "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))\n"
                               "print('ready', flush=True)\ntime.sleep(300)"],
                              env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(client.pid), str(tmp_path / "seen")], env=env,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert client.stdout.readline() == server.stdout.readline() == "ready\n"
        res = supervisor.stop(tag=tag, first=signal.SIGTERM, grace_s=30, term_s=0, last=lambda p: p.pid == server.pid)
        assert res.signals == ["SIGTERM"] and res.left == []
        assert (tmp_path / "seen").read_text() == "client gone"
        assert client.wait(timeout=10) == 0 and server.wait(timeout=10) == 0
    finally:
        supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=5)
        for p in (client, server):
            p.kill()
            p.wait()
