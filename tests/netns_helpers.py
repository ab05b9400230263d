"""A private network of Linux network namespaces for cluster tests (root only).

One namespace per node, each with a veth pair whose other end sits on a bridge in a namespace of
its own: the nodes reach each other on 10.200.N.0/24 and nothing else (the host's interfaces and
routes are not in any of them). `destroy()` kills every process left in the namespaces (found
with `ip netns pids`, so only processes started inside them) and deletes the namespaces, which
removes their veth pairs and the bridge.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid

from rftstack.doctor import netstat


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to create network namespaces"
    probe = f"rfp{uuid.uuid4().hex[:8]}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return f"`ip netns add` does not work here ({out.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class PrivateNet:
    """``nodes`` namespaces on one bridge; ``self.nodes`` is [(namespace, address)]."""

    def __init__(self, nodes: int):
        self.id = uuid.uuid4().hex[:6]
        self.subnet = random.randint(1, 250)
        self.bridge = f"rfc{self.id}br"
        self.namespaces: list[str] = []
        self.nodes: list[tuple[str, str]] = []
        try:
            self._make(nodes)
        except BaseException:
            self.destroy()
            raise

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _make(self, nodes: int) -> None:
        self._add_ns(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i in range(nodes):
            ns, dev, peer, addr = f"rfc{self.id}n{i}", f"rfc{self.id}v{i}", f"rfc{self.id}p{i}", f"10.200.{self.subnet}.{i + 1}"
            self._add_ns(ns)
            # made inside the node's namespace, so no interface ever appears in the host's
            _ip("-n", ns, "link", "add", dev, "type", "veth", "peer", "name", peer)
            _ip("-n", ns, "link", "set", peer, "netns", self.bridge)
            _ip("-n", self.bridge, "link", "set", peer, "master", "br0")
            _ip("-n", self.bridge, "link", "set", peer, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            self.nodes.append((ns, addr))

    def cmd(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def pids(self, ns: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def addresses(self, ns: str) -> dict[str, list[str]]:
        """Interface -> its IPv4/IPv6 addresses, as the namespace sees them."""
        out = subprocess.run(["ip", "-n", ns, "-o", "addr"], capture_output=True, text=True, check=True).stdout
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            parts = line.split()
            found.setdefault(parts[1], []).append(parts[3].split("/")[0])
        return found

    def listeners(self, ns: str) -> list[netstat.Listener]:
        """Listening TCP sockets in ``ns`` (its /proc/net/tcp and tcp6)."""
        found = []
        for family in ("tcp", "tcp6"):
            text = subprocess.run(self.cmd(ns, ["cat", f"/proc/net/{family}"]), capture_output=True, text=True).stdout
            found += netstat.parse(text, family)
        return found

    def kill_all(self, ns: str, grace_s: float = 15.0) -> list[int]:
        """SIGTERM, then SIGKILL, every process in ``ns``; returns those still alive after that."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            pids = self.pids(ns)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while self.pids(ns) and time.monotonic() < end:
                time.sleep(0.2)
        return self.pids(ns)

    def destroy(self) -> None:
        for ns in reversed(self.namespaces):
            self.kill_all(ns, grace_s=5.0)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()
