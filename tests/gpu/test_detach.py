"""tests/gpu/device/detach.py, as go.sh starts the GPU host's session: from a shell's background job (SIGINT and
SIGQUIT ignored there), the command runs in a session of its own with both signals back at their defaults."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

DETACH = Path(__file__).parent / "device" / "detach.py"
SIGINT_BIT, SIGQUIT_BIT = 1 << 1, 1 << 2  # /proc's SigIgn mask: bit N-1 is signal N
PROBE = ("import os, signal; print(open('/proc/self/status').read());"
         "print('handler', signal.getsignal(signal.SIGINT));"
         "print('leader', os.getsid(0) == os.getpid()); print('END')")


def ignored_mask(status: str) -> int:
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


def start_in_background(argv: list[str], tmp_path: Path) -> tuple[str, str]:
    """Start ARGV as go.sh starts its session, `(CMD ... &)` in a non-interactive bash; return its out and err."""
    out, err = tmp_path / "out", tmp_path / "err"
    words = shlex.join(argv)
    subprocess.run(["bash", "-c", f"({words} >{out} 2>{err} </dev/null &)"], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and out.read_text().endswith("END\n")) \
            and not (err.exists() and err.read_text()):
        time.sleep(0.1)
    return out.read_text(), err.read_text()


def test_a_background_job_of_the_shell_ignores_sigint(tmp_path):
    """Without detach.py: the shell's background job ignores SIGINT (what the helper exists for)."""
    out, err = start_in_background([sys.executable, "-c", PROBE], tmp_path)
    assert "END" in out, err
    assert ignored_mask(out) & SIGINT_BIT
    assert f"handler {signal.SIG_IGN}" in out


def test_detach_restores_sigint_and_starts_a_session(tmp_path):
    out, err = start_in_background([sys.executable, str(DETACH), sys.executable, "-c", PROBE], tmp_path)
    assert "END" in out, err
    assert not ignored_mask(out) & (SIGINT_BIT | SIGQUIT_BIT)
    assert "default_int_handler" in out
    assert "leader True" in out


def test_detach_without_a_command_or_with_a_missing_one_says_so():
    r = subprocess.run([sys.executable, str(DETACH)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "give the command to start" in r.stderr
    r = subprocess.run([sys.executable, str(DETACH), "no-such-command-rftstack"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PATH": "/nonexistent"})
    assert r.returncode == 127 and "cannot start no-such-command-rftstack" in r.stderr
