"""Listening TCP sockets, read from /proc/net/tcp and /proc/net/tcp6 (no external tools).

Used to prove that a serve exposes nothing outside loopback, and to find ports already in use.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class Listener:
    family: str  # "tcp" or "tcp6"
    address: str  # e.g. "127.0.0.1", "::", "0.0.0.0"
    port: int
    inode: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _decode(hex_addr: str) -> str:
    if len(hex_addr) == 8:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_addr, 16)))
    # IPv6: four 32-bit words, each in host (little-endian) order
    words = [struct.pack("<I", int(hex_addr[i : i + 8], 16)) for i in range(0, 32, 8)]
    return socket.inet_ntop(socket.AF_INET6, b"".join(words))


def parse(text: str, family: str) -> list[Listener]:
    """Listening sockets in the text of a /proc/net/tcp{,6} file."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != LISTEN:
            continue
        addr, port = parts[1].rsplit(":", 1)
        out.append(Listener(family, _decode(addr), int(port, 16), int(parts[9])))
    return out


def listeners(proc: str | os.PathLike = "/proc") -> list[Listener]:
    """Every listening TCP socket in this network namespace."""
    out: list[Listener] = []
    for family in ("tcp", "tcp6"):
        path = Path(proc) / "net" / family
        try:
            out.extend(parse(path.read_text(), family))
        except FileNotFoundError:
            continue
    return out


def socket_inodes(pid: int, proc: str | os.PathLike = "/proc") -> set[int]:
    """Inodes of the sockets a process holds open (empty if it is gone or not ours to read)."""
    inodes = set()
    fd_dir = Path(proc) / str(pid) / "fd"
    try:
        entries = list(fd_dir.iterdir())
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return inodes
    for fd in entries:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``port`` at ``host`` or at a wildcard address."""
    wild = {"0.0.0.0", "::", host}
    return any(l.port == port and (l.address in wild or l.loopback and ipaddress.ip_address(host).is_loopback) for l in listeners())


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` right now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on ``host`` right now."""
    return free_ports(1, host)[0]
