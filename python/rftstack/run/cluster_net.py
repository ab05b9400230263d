"""Decisions for a Ray cluster on a private network: which address a node may listen on, which
local address reaches the head, the token file and the TLS files a node is given.

Each function answers a problem as one sentence (or None when there is none), so the commands
(`rftstack ray-head --listen`, `rftstack ray-worker`) refuse bad input before starting anything.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
from pathlib import Path

# Ray's TLS settings (ray/_private/grpc_utils.py, ray/_private/tls_utils.py): every node and every
# driver of the cluster needs the same four.
TLS_VARS = {"cert": "RAY_TLS_SERVER_CERT", "key": "RAY_TLS_SERVER_KEY", "ca": "RAY_TLS_CA_CERT"}


def split_address(address: str) -> tuple[str, int]:
    """"HOST:PORT" -> (host, port); ValueError with a sentence when it is not one."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT; pass the head's address as printed by `rftstack ray-head --listen` (e.g. 10.0.0.1:6379)")
    return host, int(port)


def is_local_address(addr: str) -> bool:
    """Whether ``addr`` is an address of an interface of this machine (this network namespace)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def listen_problem(addr: str, *, allow_public: bool, local: bool) -> str | None:
    """Why a node must not listen on ``addr`` (None when it may): not an IP, the unspecified
    address, a public address (unless ``allow_public``), or not an address of this machine."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return f"--listen {addr!r} is not an IP address; pass the private address of the interface the other nodes reach (see `ip -br addr`)"
    if ip.is_unspecified:
        return (f"--listen {addr} is not one interface but all of them, and Ray advertises this address to the other nodes; "
                "pass the private address of the interface the other nodes reach (see `ip -br addr`)")  # fmt: skip
    if ip.is_global and not allow_public:
        return (f"--listen {addr} is a public address, so the Ray cluster would be reachable from the internet; "
                "use a private network (10.x, 172.16-31.x, 192.168.x, a VPN) or pass --allow-public if a firewall guards it")  # fmt: skip
    if not local:
        return f"--listen {addr} is not an address of this machine; pick one from `ip -br addr`"
    return None


def route_source(host: str, port: int) -> str:
    """The local address this machine uses to reach ``host`` (a UDP connect sends nothing: the
    kernel only picks the route and its source address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def token_problem(path: Path | None) -> str | None:
    """Why ``path`` cannot serve as a node's token file (None when it can)."""
    if path is None:
        return ("a node joins only with the head's token: pass --token-file FILE "
                "(a copy of the head's auth_token file, made over a secure channel such as scp, mode 600)")  # fmt: skip
    try:
        st = path.stat()
        text = path.read_text().strip()
    except FileNotFoundError:
        return f"the token file {path} does not exist; copy the head's auth_token file there (scp, mode 600)"
    except OSError as exc:
        return f"the token file {path} cannot be read ({exc.strerror}); fix its permissions"
    if not text:
        return f"the token file {path} is empty; copy the head's auth_token file there again"
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"the token file {path} can be read by other users; run `chmod 600 {path}`"
    return None


def tls_env(cert: Path | None, key: Path | None, ca: Path | None) -> tuple[dict[str, str], str | None]:
    """Ray's TLS variables for the given files, or a problem: all three or none, each readable."""
    given = {"cert": cert, "key": key, "ca": ca}
    if not any(given.values()):
        return {}, None
    missing = [f"--tls-{k}" for k, v in given.items() if v is None]
    if missing:
        return {}, f"TLS needs --tls-cert, --tls-key and --tls-ca together; {', '.join(missing)} missing"
    for k, v in given.items():
        if not os.access(v, os.R_OK):
            return {}, f"--tls-{k} {v} is not a readable file; give the PEM file of this node"
    env = {TLS_VARS[k]: str(Path(v).absolute()) for k, v in given.items()}
    return {"RAY_USE_TLS": "1", **env}, None
