"""`rftstack ray-worker`: a Ray worker node that joins a head started with `rftstack ray-head --listen`.

The node joins only with the head's token (a copy of its auth_token file, given with --token-file;
refused before anything starts when it is missing, empty or readable by others), advertises the
local address of the route to the head (a UDP connect to the head, then getsockname) and binds
there what Ray lets bind to one address; every port of its own is chosen free and passed
explicitly. Ray's TLS is on when --tls-cert/--tls-key/--tls-ca are given. The processes carry a
tag (supervisor.TAG_VAR): `rftstack ray-worker stop`, Ctrl-C or SIGTERM of a `--block` worker
stop exactly them. The head's `ray start` machinery, state file and stop are ray_head's.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rftstack.doctor import cluster_net
from rftstack.run import niceness, ray_head, supervisor
from rftstack.errors import UserError

# the head's ports are its own; a worker runs only these servers
WORKER_PORTS = ("node_manager", "object_manager", "metrics_export", "dashboard_agent_http", "dashboard_agent_grpc", "runtime_env_agent")


def worker_argv(ray_bin: str, head_address: str, node_ip: str, ports: dict[str, int], temp_dir: str,
                num_gpus: int, num_cpus: int | None) -> list[str]:  # fmt: skip
    return [ray_bin, "start", f"--address={head_address}", f"--node-ip-address={node_ip}",
            *ray_head.node_argv(ports, temp_dir, num_gpus, num_cpus)]  # fmt: skip


def head_reachable(host: str, port: int, timeout: float = 5.0) -> str | None:
    """Why the head's GCS port cannot be reached from here (None when a TCP connect succeeds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return (f"the Ray head at {host}:{port} cannot be reached from this machine ({exc.strerror or exc}); "
                "check the address, that the head runs with --listen, and that the firewall lets this node in (docs/cluster.md)")  # fmt: skip


def start(
    *,
    head_address: str,
    token_path: Path,
    state_dir: Path,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    tls: dict | None = None,
    progress=lambda msg: None,
    env: dict | None = None,
) -> ray_head.Head:
    """Check the token and the route to the head, then start the node (retried once on a slow start)."""
    problem = cluster_net.token_problem(token_path)
    if problem:
        raise UserError(problem)
    try:
        host, port = cluster_net.split_address(head_address)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    problem = head_reachable(host, port)
    if problem:
        raise UserError(problem)
    node_ip = cluster_net.route_source(host, port)
    ray_bin = ray_head.ray_executable()

    def once() -> ray_head.Head:
        return _start_once(ray_bin, head_address, node_ip, token_path.absolute(), state_dir, num_gpus, num_cpus, tls, progress, env)

    return ray_head.with_retry(once, progress=progress)


def _start_once(ray_bin, head_address, node_ip, token_path, state_dir, num_gpus, num_cpus, tls, progress, env) -> ray_head.Head:
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(WORKER_PORTS, ray_head.free_ports(len(WORKER_PORTS), node_ip)))
    temp_dir = tempfile.mkdtemp(prefix="rfts-rayw-", dir="/tmp")  # short: Ray's unix sockets live there
    tag = f"ray-worker-{uuid.uuid4().hex[:12]}"
    gpus = ray_head.detect_gpus() if num_gpus is None else num_gpus
    full_env = {**(os.environ if env is None else env), **ray_head.node_env(head_address, str(token_path), tag, tls)}
    full_env.pop("RAY_AUTH_TOKEN", None)  # the token file is the one source
    node = ray_head.Head(head_address, ports, temp_dir, str(token_path), tag, gpus, time.time(),
                         node_ip=node_ip, role="worker", tls=dict(tls or {}))  # fmt: skip
    progress(f"starting Ray worker node on {node_ip} ({gpus} GPU(s)), joining {head_address}")
    t0 = time.monotonic()
    ray_head.launch(node, worker_argv(ray_bin, head_address, node_ip, ports, temp_dir, gpus, num_cpus), full_env,
                    state_dir / "ray-start.log", progress)  # fmt: skip
    try:
        seen = ray_head.probe_cluster(head_address, {**full_env, supervisor.TAG_VAR: tag})
    except UserError:
        ray_head.stop(node)
        raise
    mine = [n for n in seen["nodes"] if n["ip"] == node_ip and n["alive"]]
    if not mine:
        ray_head.stop(node)
        raise UserError(f"the worker node started but the head at {head_address} does not list {node_ip} as alive; see {state_dir / 'ray-start.log'}", 1)
    node.resources = mine[0]["resources"]
    node.wildcard_ports = ray_head.wildcard_ports(node)
    progress(f"Ray worker node {node_ip} joined {head_address} after {time.monotonic() - t0:.0f} s")
    return node


# ---- CLI ----------------------------------------------------------------------------------------


def configure(parser) -> None:
    ray_head.configure_common(parser, "worker")
    parser.add_argument("--address", metavar="HEAD:PORT", default=None, help="the head's address (printed by `rftstack ray-head --listen`)")
    parser.add_argument("--token-file", type=Path, default=None, help="a copy of the head's auth_token file (mode 600)")


def run(args) -> int:
    state_dir = (args.state_dir or ray_head.default_state_dir("worker")).absolute()
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    args.action = "stop" if args.stop_flag else args.action
    if args.action in ("status", "stop"):
        return ray_head.status_or_stop(args, state_dir, "worker")
    if args.address is None:
        raise UserError("ray-worker needs the head's address: pass --address HEAD:PORT (printed by `rftstack ray-head --listen`)")
    tls = ray_head.tls_from_args(args)
    existing = ray_head.running(state_dir, "worker")
    if existing is not None:
        ray_head.report(existing, args, already_running=True)
        return 0
    nice = niceness.asked(args.worker_niceness, os.environ)
    node = start(head_address=args.address, token_path=args.token_file, state_dir=state_dir, num_gpus=args.num_gpus,
                 num_cpus=args.num_cpus, tls=tls, progress=say, env={**os.environ, **niceness.head_env(nice)})  # fmt: skip
    ray_head.save(node, state_dir)
    ray_head.report(node, args, worker_niceness=niceness.effective(nice))
    if not args.block:
        return 0
    return ray_head.block(node, state_dir, say)
