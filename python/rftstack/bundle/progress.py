"""A byte-counting progress display: one redrawn line on a TTY, plain timestamped lines otherwise."""

from __future__ import annotations

import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def human_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Counts bytes towards ``total``; shows bytes, rate and ETA.

    On a TTY one line is redrawn at most every ``tty_interval`` seconds; elsewhere (CI logs, pipes)
    a plain line is printed every ``line_interval`` seconds, plus one per ``note`` call.
    """

    def __init__(self, total: int, *, stream=None, tty: bool | None = None, line_interval: float = 10.0, tty_interval: float = 0.2):
        self.total = max(total, 0)
        self.done = 0
        self.skipped = 0  # bytes counted as done without transfer (already present): not in the rate
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.label = ""
        self.start = time.monotonic()
        self._last = 0.0
        self.interval = tty_interval if self.tty else line_interval

    def rate(self) -> float:
        elapsed = time.monotonic() - self.start
        return (self.done - self.skipped) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        eta = human_seconds((self.total - self.done) / rate) if rate > 0 and self.total >= self.done else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        bar = ""
        if self.tty:
            width = 24
            fill = int(width * min(pct, 100) / 100)
            bar = "[" + "#" * fill + "." * (width - fill) + "] "
        return f"{bar}{pct:5.1f}% {human_bytes(self.done)}/{human_bytes(self.total)} {human_bytes(rate)}/s ETA {eta} {self.label}"

    def set_label(self, label: str) -> None:
        self.label = label

    def skip(self, n: int) -> None:
        """Count ``n`` bytes as done that needed no transfer."""
        self.done += n
        self.skipped += n

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._show()

    def _show(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line()[:200])
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        """A line that stays (a finished file); the TTY bar is redrawn under it."""
        if self.tty:
            self.stream.write("\r\033[K" + message + "\n")
            self._show()
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._show()
            self.stream.write("\n")
        else:
            self._show()
        self.stream.flush()
