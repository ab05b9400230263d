"""progress: plain lines off a TTY, bytes/rate/ETA, skipped bytes not counted in the rate."""

from __future__ import annotations

import io

from rftstack.bundle.progress import Progress, human_bytes, human_seconds


def test_plain_lines_when_not_a_tty():
    out = io.StringIO()
    p = Progress(4 * 2**20, stream=out, line_interval=0)
    p.set_label("x.whl")
    p.skip(2**20)
    p.advance(2**20)
    p.note("[1/2] x.whl done")
    p.close()
    text = out.getvalue()
    assert "\r" not in text and "\033" not in text
    assert "50.0% 2.0 MiB/4.0 MiB" in text and "ETA" in text and "x.whl" in text
    assert "[1/2] x.whl done\n" in text
    assert p.done - p.skipped == 2**20


def test_tty_redraws_one_line():
    out = io.StringIO()
    p = Progress(100, stream=out, tty=True, tty_interval=0)
    p.advance(50)
    p.close()
    assert out.getvalue().startswith("\r\033[K[") and "#" * 12 in out.getvalue()


def test_units():
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_seconds(75) == "1m15s" and human_seconds(7300) == "2h01m"
