"""Start a command detached (a session of its own) with SIGINT and SIGQUIT at their defaults.

    python3 tests/gpu/device/detach.py CMD [ARG...]

go.sh starts tests/gpu/host_session.sh with it, in the background. A shell leaves SIGINT and SIGQUIT ignored in
what it starts with `&` (no job control), an ignored signal stays ignored across exec, and so every bench server
and test the session started ignored the SIGINT it is stopped with and was killed only after its grace period (the
cause of CI's slow stops in session AG, tests/conftest.py; on the GPU host the same start). Here both go back to
their defaults before the exec, so Python children install their KeyboardInterrupt handler again.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: detach.py CMD [ARG...]: give the command to start", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.setsid()
    except PermissionError:  # already a session leader: keep that session
        pass
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"detach.py: cannot start {argv[0]}: {e.strerror}; check the command's name and PATH", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
