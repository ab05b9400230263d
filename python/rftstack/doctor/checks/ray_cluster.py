"""Ray: is a cluster already running and reachable? Read the way `ray.init(address="auto")` finds
one (RAY_ADDRESS, else ``{RAY_TMPDIR or TMPDIR or /tmp}/ray/ray_current_cluster``), then a TCP
connect to its GCS port. Ray itself is not imported.
"""

from __future__ import annotations

import socket
from pathlib import Path

from rftstack.findings import FAIL, INFO, OK, WARN, Finding


def address_file(env) -> Path:
    """ray._common.utils.get_ray_address_file(None)."""
    base = env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def find_address(env) -> tuple[str | None, str]:
    """(address, where it came from)."""
    a = env.get("RAY_ADDRESS")
    if a and a != "auto":
        return a, "RAY_ADDRESS"
    f = address_file(env)
    try:
        text = f.read_text().strip()
    except OSError:
        return None, str(f)
    return (text.splitlines()[0].strip() if text else None), str(f)


def reachable(address: str, timeout: float = 0.5) -> tuple[bool, str]:
    addr = address.split("://", 1)[-1]
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            return True, ""
    except (OSError, ValueError) as exc:
        return False, str(exc)


def check(address: str | None, source: str, ok: bool | None, why: str = "") -> list[Finding]:
    if address is None:
        return [Finding("ray.cluster", INFO, f"No Ray cluster is running (no RAY_ADDRESS, no {source}).",
                        "", {"source": source})]
    if address.startswith("ray://"):
        return [Finding("ray.cluster", INFO, f"RAY_ADDRESS is a Ray client address ({address}); not probed.", "", {"address": address})]
    if ok:
        return [Finding("ray.cluster", OK, f"A Ray cluster is running and its GCS at {address} answers (from {source}); Trinity will join it.", "",
                        {"address": address, "source": source})]
    if source == "RAY_ADDRESS":
        return [Finding("ray.cluster", FAIL, f"RAY_ADDRESS={address} does not answer ({why}), so Trinity cannot join a cluster.",
                        "Start the head (`rftstack ray-head start`) or unset RAY_ADDRESS.", {"address": address, "source": source})]
    return [Finding("ray.cluster", WARN, f"{source} names a Ray cluster at {address} that does not answer ({why}): a stale file from a head that died.",
                    f"Run `ray stop` (or delete {source}) before starting a new head.", {"address": address, "source": source})]
