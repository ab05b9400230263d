"""Process groups, tags, signals and teardown, read from /proc (no psutil).

Every process rftstack starts carries an environment tag (``RFTSTACK_TAG=<id>``). Children inherit
it, including the processes that Ray daemonizes (they are reparented to init) and the workers that
Ray's raylet forks, so "everything this serve started" is the set of live processes whose
``/proc/<pid>/environ`` holds the tag: no process can escape teardown by changing its process
group or session.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

TAG_VAR = "RFTSTACK_TAG"
PR_SET_CHILD_SUBREAPER = 36


@dataclasses.dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # one letter, "Z" for a zombie
    cmdline: str


def read_proc(pid: int, proc: str = "/proc") -> ProcInfo | None:
    """One process's stat fields and command line, or None if it is gone."""
    try:
        stat = Path(proc, str(pid), "stat").read_text()
        raw = Path(proc, str(pid), "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may hold spaces: split after the last ")"
    rest = stat[stat.rindex(")") + 2 :].split()
    return ProcInfo(pid, int(rest[1]), int(rest[2]), rest[0], raw.replace(b"\0", b" ").decode(errors="replace").strip())


def all_pids(proc: str = "/proc") -> list[int]:
    return [int(n) for n in os.listdir(proc) if n.isdigit()]


def has_tag(pid: int, tag: str, proc: str = "/proc") -> bool:
    try:
        env = Path(proc, str(pid), "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{TAG_VAR}={tag}".encode() in env.split(b"\0")


def tagged(tag: str, proc: str = "/proc") -> list[ProcInfo]:
    """Live (non-zombie) processes that carry ``tag``, and their descendants; this process excluded.

    Descendants count because a process that retitles itself with setproctitle (vLLM's
    VLLM::EngineCore and VLLM::Worker, Ray's ray::Actor) overwrites the memory that
    /proc/PID/environ shows, so its tag can no longer be read; its parent's still can.
    """
    infos: dict[int, ProcInfo] = {}
    found: set[int] = set()
    for pid in all_pids(proc):
        info = read_proc(pid, proc) if pid != os.getpid() else None
        if info is None or info.state == "Z":
            continue
        infos[pid] = info
        if has_tag(pid, tag, proc):
            found.add(pid)
    grew = bool(found)
    while grew:
        new = {pid for pid, info in infos.items() if pid not in found and info.ppid in found}
        found |= new
        grew = bool(new)
    return [infos[pid] for pid in sorted(found)]


ENGINE_TITLE_PREFIX = "VLLM::"  # vLLM titles its processes VLLM::EngineCore, VLLM::Worker... (setproctitle)


def engine_processes(tag: str, proc: str = "/proc") -> dict[int, str]:
    """pid -> title of the tagged processes that vLLM titled as its own (engine core, workers)."""
    return {p.pid: p.cmdline.split()[0] for p in tagged(tag, proc) if p.cmdline.startswith(ENGINE_TITLE_PREFIX)}


def in_group(pgid: int, proc: str = "/proc") -> list[ProcInfo]:
    """Live processes of process group ``pgid``."""
    out = []
    for pid in all_pids(proc):
        info = read_proc(pid, proc)
        if info is not None and info.pgid == pgid and info.state != "Z":
            out.append(info)
    return out


def alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.state != "Z"


def set_subreaper() -> bool:
    """Make orphaned descendants reparent to this process (so they can be found and reaped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(keep: Iterable[int] = ()) -> list[int]:
    """Reap zombie children other than ``keep`` (the Popen children whose status we still want)."""
    keep = set(keep)
    reaped = []
    me = os.getpid()
    for pid in all_pids():
        if pid in keep:
            continue
        info = read_proc(pid)
        if info is not None and info.ppid == me and info.state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None or pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclasses.dataclass
class StopResult:
    signals: list[str]  # the signals sent, in order, e.g. ["SIGINT", "SIGTERM", "SIGKILL"]
    left: list[ProcInfo]  # processes still alive at the end (should be empty)
    seconds: float


def stop(
    *,
    tag: str | None,
    pgid: int | None = None,
    first: int = signal.SIGTERM,
    grace_s: float = 30.0,
    term_s: float = 10.0,
    kill_s: float = 5.0,
    keep_reaping: Iterable[int] = (),
    leader: int | None = None,
    on_wait: Callable[[float, int], None] | None = None,
    hurry: Callable[[], bool] | None = None,
    last: Callable[[ProcInfo], bool] | None = None,
) -> StopResult:
    """Stop a process group and every process carrying ``tag``: ``first`` signal to the group,
    SIGTERM to all after ``grace_s``, SIGKILL to all after ``term_s`` more; waits until none is
    left (or ``kill_s`` after SIGKILL). ``first`` goes to the group only (the group leader decides
    how to shut down its own children); escalations go to every process found. When ``leader``
    (the pid the first signal was meant for) is gone, the grace period ends early: what is left
    then has escaped its leader's shutdown and gets SIGTERM at once. When ``hurry()`` turns true
    (a second Ctrl-C), the grace periods end. Without ``pgid``, processes for which ``last(p)``
    holds get ``first`` only once every other process is gone (or the grace period is over): a
    server whose clients must leave before it can shut down (Ray's GCS server).
    """
    t0 = time.monotonic()
    sent: list[str] = []

    def members() -> list[ProcInfo]:
        found = {p.pid: p for p in (tagged(tag) if tag else [])}
        if pgid is not None:
            found.update({p.pid: p for p in in_group(pgid)})
        found.pop(os.getpid(), None)
        return list(found.values())

    def held(p: ProcInfo) -> bool:
        return last is not None and last(p)

    def wait(limit: float, until_leader_gone: bool = False, hurryable: bool = True,
             but_held: bool = False) -> list[ProcInfo]:  # fmt: skip
        end = time.monotonic() + limit
        while True:
            reap_orphans(keep_reaping)
            left = members()
            if not left or time.monotonic() >= end:
                return left
            if but_held and all(held(p) for p in left):
                return left
            if until_leader_gone and leader is not None and not alive(leader):
                return left
            if hurryable and hurry is not None and hurry():
                return left
            if on_wait:
                on_wait(time.monotonic() - t0, len(left))
            time.sleep(0.2)

    left = members()
    if not left:
        return StopResult(sent, [], time.monotonic() - t0)
    grace_end = time.monotonic() + grace_s
    if pgid is not None:
        _signal_group(pgid, first)  # the whole group, ``last`` or not: its leader orders its own shutdown
    else:
        _signal((p.pid for p in left if not held(p)), first)
    sent.append(signal.Signals(first).name)
    if any(held(p) for p in left):
        left = wait(grace_s, until_leader_gone=True, but_held=True)
        _signal((p.pid for p in left if held(p)), first)
    left = wait(max(0.0, grace_end - time.monotonic()), until_leader_gone=True)
    if left and first != signal.SIGTERM:
        _signal_group(pgid, signal.SIGTERM)
        _signal((p.pid for p in left), signal.SIGTERM)
        sent.append("SIGTERM")
        left = wait(term_s)
    if left:
        _signal_group(pgid, signal.SIGKILL)
        _signal((p.pid for p in left), signal.SIGKILL)
        sent.append("SIGKILL")
        left = wait(kill_s, hurryable=False)
    return StopResult(sent, left, time.monotonic() - t0)


class LinePump(threading.Thread):
    """Copies a child's output, line by line, to a sink (a rotated log) and keeps the last lines."""

    def __init__(self, stream, sink: Callable[[str], None], keep: int = 200):
        super().__init__(daemon=True)
        self.stream = stream
        self.sink = sink
        self.keep = keep
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        for raw in iter(self.stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.sink(line)
            with self._lock:
                self.lines.append(line)
                if len(self.lines) > self.keep:
                    del self.lines[: len(self.lines) - self.keep]
        self.stream.close()

    def tail(self, n: int = 20) -> list[str]:
        with self._lock:
            return self.lines[-n:]


def spawn(argv: list[str], *, env: dict, cwd: str | None = None, sink: Callable[[str], None]) -> tuple[subprocess.Popen, LinePump]:
    """Start ``argv`` in a new session (its own process group), output piped to ``sink``."""
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pump = LinePump(proc.stdout, sink)
    pump.start()
    return proc, pump
