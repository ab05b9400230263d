"""The run directory of one serve: logs (rotated), the effective config, and a status file.

Layout (see docs/serve.md)::

    <run>/status.json        phase, pids, endpoint, ports, times, exit reason (rewritten atomically)
    <run>/config.user.yaml   the config as given (or the embedded default)
    <run>/config.yaml        the effective config trinity runs
    <run>/changes.json       what the effective config changed, and why
    <run>/logs/serve.log     rftstack's own progress lines
    <run>/logs/trinity.log   trinity's output (rotated: trinity.log.1 ... .N)
    <run>/logs/ray-start.log `ray start` output; Ray's own logs are under <run>/ray/session_latest/logs
    <run>/checkpoints/...    trinity's checkpoint_root_dir unless the config names one (buffer/ inside)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import threading
from pathlib import Path

DEFAULT_BASE = "rftstack-runs"


def timestamp(now: _dt.datetime | None = None) -> str:
    return (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def user_config(self) -> Path:
        return self.root / "config.user.yaml"

    @property
    def changes(self) -> Path:
        return self.root / "changes.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def log(self, name: str) -> Path:
        return self.logs / name


def create(run_dir: str | os.PathLike | None = None, base: str | os.PathLike = DEFAULT_BASE) -> RunDir:
    """A new run directory: ``run_dir`` itself (must be absent or empty) or ``<base>/<timestamp>``."""
    if run_dir is not None:
        root = Path(run_dir).absolute()
        if root.exists() and any(root.iterdir()):
            from rftstack.errors import UserError

            raise UserError(f"run directory {root} is not empty; pass a new --run-dir or remove it")
    else:
        stem = Path(base).absolute() / timestamp()
        root, n = stem, 1
        while root.exists():
            n += 1
            root = stem.with_name(f"{stem.name}-{n}")
    try:
        (root / "logs").mkdir(parents=True, exist_ok=True)
        probe = root / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        from rftstack.errors import UserError

        raise UserError(f"cannot create the run directory {root} ({exc.strerror}); pass a writable --run-dir or --runs-base") from None
    return RunDir(root)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Status:
    """The status file: a JSON object updated in place (atomically) as the serve moves on."""

    def __init__(self, path: Path, **initial):
        self.path = path
        self.data: dict = {"phase": "starting", "started_at": now_iso(), **initial}
        self._lock = threading.Lock()
        self._write()

    def update(self, **fields) -> None:
        with self._lock:
            self.data.update(fields)
            self._write()

    def _write(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str) + "\n")


class RotatingLog:
    """A line log that rotates by size: ``name`` -> ``name.1`` -> ... -> ``name.<backups>``."""

    def __init__(self, path: Path, max_bytes: int = 20 * 1024 * 1024, backups: int = 5):
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._f = open(path, "a", buffering=1, encoding="utf-8", errors="replace")

    def write(self, line: str) -> None:
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line + "\n")
            if self._f.tell() >= self.max_bytes:
                self._rotate()

    def _rotate(self) -> None:
        self._f.close()
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._f = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")

    def close(self) -> None:
        with self._lock:
            self._f.close()
