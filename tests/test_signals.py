"""tests/conftest.py: the processes a test starts get SIGINT's default (Python's KeyboardInterrupt), also where the run
was started in the background with SIGINT ignored (as a CI runner may start it): the stops the code under test makes
with SIGINT reach them at once instead of after a grace period."""

from __future__ import annotations

import signal
import subprocess
import sys


def test_a_child_of_the_test_run_takes_sigint():
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).__name__)"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "default_int_handler", child.stderr


def test_a_child_stopped_with_sigint_ends_at_once():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline().strip() == "up"
        child.send_signal(signal.SIGINT)
        child.wait(timeout=10)  # ignored, it would sleep its 60 s
    finally:
        child.kill()
    # Python ends an uncaught KeyboardInterrupt by taking SIGINT's default action itself
    assert child.returncode == -signal.SIGINT and "KeyboardInterrupt" in child.stderr.read()
