"""Network: the ports serve mode needs are free, and who can reach the proxy's listen address.

Ports come from ``rftstack.doctor.netstat`` (/proc/net/tcp{,6}), so nothing is bound to test them.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from rftstack.doctor import netstat
from rftstack.findings import FAIL, OK, WARN, Finding

DEFAULT_PROXY_PORT = 8010  # trinity ExplorerConfig.proxy_port
DEFAULT_LISTEN = "0.0.0.0"  # trinity ExplorerConfig.listen_address
RAY_PORTS = {6379: "Ray GCS", 8265: "Ray dashboard", 10001: "Ray client server"}  # `ray start --head` defaults


def conflicts(port: int, host: str, listeners: list[netstat.Listener]) -> list[netstat.Listener]:
    """Listeners that would make binding ``host:port`` fail."""
    wild = {"0.0.0.0", "::"}
    out = []
    for l in listeners:
        if l.port != port:
            continue
        if host in wild or l.address in wild or l.address == host or (l.address.startswith("::ffff:") and l.address[7:] == host):
            out.append(l)
    return out


def holder(inode: int, proc: str = "/proc") -> str | None:
    """'name (pid N)' of the process that holds a socket inode, if this user may see it."""
    for pid_dir in Path(proc).iterdir():
        if not pid_dir.name.isdigit():
            continue
        if inode in netstat.socket_inodes(int(pid_dir.name), proc):
            try:
                name = (pid_dir / "comm").read_text().strip()
            except OSError:
                name = "?"
            return f"{name} (pid {pid_dir.name})"
    return None


def exposure(listen_address: str) -> str | None:
    """Who beyond this machine can reach an address; None for loopback."""
    try:
        ip = ipaddress.ip_address(listen_address)
    except ValueError:
        return "whoever can resolve and reach the host name " + listen_address  # a name
    if ip.is_loopback:
        return None
    if ip.is_unspecified:
        return "anyone who can reach any address of this machine"
    return f"anyone who can reach {listen_address}"


def check(proxy_port: int, listen_address: str, listeners: list[netstat.Listener], ray_address: str | None = None,
          who=holder, listen_is_default: bool = False) -> list[Finding]:
    out = []
    # the proxy
    c = conflicts(proxy_port, listen_address, listeners)
    if c:
        by = who(c[0].inode) or "another process"
        out.append(Finding("network.proxy_port", FAIL, f"Port {proxy_port} (explorer.proxy_port) is already taken on {c[0].address} by {by}, so Trinity's proxy cannot start.",
                           "Stop that process or set `explorer.proxy_port` to a free port.", {"port": proxy_port, "holder": by}))
    else:
        out.append(Finding("network.proxy_port", OK, f"Port {proxy_port} (explorer.proxy_port) is free.", "", {"port": proxy_port}))
    who_can = exposure(listen_address)
    if who_can:
        out.append(Finding("network.listen_address", WARN,
                           f"The proxy listens on {listen_address}:{proxy_port}{' (Trinity default)' if listen_is_default else ''}, so {who_can} can call the model and post /feedback and /commit (training data) without authentication.",
                           "Set `explorer.listen_address: 127.0.0.1` and let remote agents in through an SSH tunnel or an authenticating reverse proxy.",
                           {"listen_address": listen_address}))
    else:
        out.append(Finding("network.listen_address", OK, f"The proxy listens on loopback ({listen_address}:{proxy_port}) only.", ""))
    # Ray's default head ports: in use by the running cluster is fine, by anything else is not
    ray_port = None
    if ray_address and ":" in ray_address:
        try:
            ray_port = int(ray_address.rsplit(":", 1)[1])
        except ValueError:
            pass
    taken = []
    for port, what in RAY_PORTS.items():
        c = conflicts(port, "0.0.0.0", listeners)
        if c and not (ray_address and (port == ray_port or port in (8265, 10001))):
            taken.append((port, what, who(c[0].inode) or "another process"))
    if taken:
        desc = ", ".join(f"{p} ({w}) by {h}" for p, w, h in taken)
        out.append(Finding("network.ray_ports", WARN, f"Ray's default head ports are taken: {desc}, so a plain `ray start --head` fails.",
                           "Let `rftstack serve` start the head (it picks free ports) or pass `ray start --head --port=<free port>`.",
                           {"taken": [p for p, _, _ in taken]}))
    else:
        out.append(Finding("network.ray_ports", OK, "Ray's default head ports (6379, 8265, 10001) are free" + (" or held by the running cluster." if ray_address else "."), ""))
    return out
