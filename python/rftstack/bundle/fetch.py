"""Download a locked file by URL, verify its sha256, and resume what an earlier run left behind.

A finished file lies at its final name only after its hash matched. Bytes in flight go to
``NAME.part``; the next run continues it with an HTTP Range request (or starts over when the
server ignores the range). A final file whose hash is wrong (truncated, damaged) is treated as a
partial download: continued once, then, if the result is still wrong, fetched again from scratch.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from rftstack.errors import UserError

_BLOCK = 1 << 20
PRESENT, DOWNLOADED, RESUMED = "present", "downloaded", "resumed"
USER_AGENT = "rftstack-bundle (+https://pypi.org)"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def disk_full(path: Path, need: int | None = None) -> UserError:
    extra = f" ({need / 2**20:.0f} MiB needed)" if need else ""
    return UserError(f"the disk holding {path.parent} is full{extra}; free space or pass --out/--cache on a larger disk", 1)


def _stream(url: str, part: Path, offset: int, advance, timeout: float) -> int:
    """Append the bytes from ``offset`` on to ``part``; returns the offset actually used."""
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # the partial file is already as long as (or longer than) the file
            part.unlink(missing_ok=True)
            return -1
        raise
    with resp:
        if offset and resp.status != 206:
            offset = 0  # the server sent the whole file: start over
            if advance:
                advance(-part.stat().st_size)
        expected = resp.headers.get("Content-Length")
        written = 0
        with open(part, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            while True:
                block = resp.read(_BLOCK)
                if not block:
                    break
                f.write(block)
                written += len(block)
                if advance:
                    advance(len(block))
        if expected and expected.isdigit() and written < int(expected):  # the connection closed early
            raise http.client.IncompleteRead(b"", int(expected) - written)
    return offset


def download(url: str, dest: Path, sha256: str, size: int | None = None, *, advance=None, retries: int = 4, timeout: float = 60.0,
             source: str = "uv.lock") -> str:
    """Make ``dest`` the file at ``url`` with hash ``sha256``; returns PRESENT, DOWNLOADED or RESUMED.

    ``advance(n)`` is called with the bytes written (negative when a partial file is dropped);
    ``source`` names where the hash and size come from, in the error sentences.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    if dest.exists():
        if (size is None or dest.stat().st_size == size) and sha256_file(dest) == sha256:
            return PRESENT
        os.replace(dest, part)  # a wrong final file: continue it like a partial download
    resumed = part.exists() and part.stat().st_size > 0
    if advance and part.exists():
        advance(part.stat().st_size)
    fresh_tried = not resumed
    attempt = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        if size is not None and have > size:
            if advance:
                advance(-have)
            part.unlink()
            have = 0
        try:
            if size is None or have < size:
                if _stream(url, part, have, advance, timeout) == -1:
                    continue
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise disk_full(dest, size) from None
            if isinstance(exc, urllib.error.HTTPError) and exc.code in (403, 404, 410):
                raise UserError(f"{url} answered HTTP {exc.code}; {source} points at a file the server no longer serves, update {source}") from None
            attempt += 1
            if attempt > retries:
                raise UserError(f"downloading {dest.name} failed {attempt} times ({exc}); check the network or proxy and run the same command again to resume") from None
            time.sleep(min(2**attempt, 15))
            continue
        except http.client.HTTPException as exc:
            attempt += 1
            if attempt > retries:
                raise UserError(f"downloading {dest.name} failed {attempt} time(s) ({exc!r}{': the connection closed before the whole file came' if isinstance(exc, http.client.IncompleteRead) else ''}); run the same command again to resume", 1) from None
            time.sleep(min(2**attempt, 15))
            continue
        digest = sha256_file(part)
        if digest == sha256:
            os.replace(part, dest)
            return RESUMED if resumed else DOWNLOADED
        if not fresh_tried:  # the kept prefix was bad: start over once
            fresh_tried = True
            if advance:
                advance(-part.stat().st_size)
            part.unlink()
            continue
        got = part.stat().st_size
        part.unlink()
        if size is not None and got != size:
            raise UserError(f"{dest.name} from {url} is {got} bytes, but {source} says {size}: a truncated or wrong download, nothing was kept; run the same command again or check the mirror", 1)
        raise UserError(f"{dest.name} from {url} has sha256 {digest}, but {source} says {sha256}; the download or {source} is wrong, check the mirror (or update {source})", 1)
