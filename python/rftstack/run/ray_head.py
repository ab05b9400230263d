"""`rftstack ray-head`: a Ray head for this machine, on loopback only, with token authentication.

What plain `ray start --head --node-ip-address=127.0.0.1` gets wrong (read from Ray 2.60 and seen
on a real head, see docs/serve.md):

- `ray start` rewrites a loopback --node-ip-address to the host's address
  (`services.resolve_ip_for_localhost`), so the GCS, raylet and worker gRPC servers bind to all
  interfaces and the client server to the host address. `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
  makes `get_node_ip_address()` answer 127.0.0.1 (Ray's single-machine mode): every Ray server
  then binds loopback. Clients need the same variable, or they dial the host address.
- Token auth (`RAY_AUTH_MODE=token`) reads the token from `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`
  or `~/.ray/auth_token`. We write a private token file (0600) next to the head's state and pass
  its path, so `~/.ray` is never touched and every head has its own token.
- Fixed default ports (dashboard 8265, agent 52365, metrics 44217/44227, GCS 6379) collide
  between heads; every port is chosen free on 127.0.0.1 and passed explicitly.

With ``--listen ADDR`` (a private address) the head serves other nodes (`rftstack ray-worker`,
see ray_worker.py and docs/cluster.md): Ray then binds the dashboard, the client server and the
runtime-env agent to ADDR, but its gRPC servers (GCS, raylet, object manager, agents) to every
interface: Ray 2.60 has no setting for that (its C++ servers bind the wildcard unless the node
address is 127.0.0.1). Those ports are reported (``wildcard_ports``) so a firewall can keep them
on the private network.

Heads are stopped by their tag (supervisor.TAG_VAR), never with `ray stop` (which kills every Ray
process of the user, other heads included).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from rftstack.doctor.netstat import free_ports
from rftstack.run import niceness, supervisor
from rftstack.errors import UserError
from rftstack.doctor.cluster_net import client_env, is_loopback_host  # noqa: F401 - re-exported: callers reach a head through run.ray_head

LOOPBACK = "127.0.0.1"
PORT_NAMES = (
    "gcs",
    "dashboard",
    "client_server",
    "node_manager",
    "object_manager",
    "metrics_export",
    "dashboard_agent_http",
    "dashboard_agent_grpc",
    "runtime_env_agent",
    "dashboard_metrics",
    "autoscaler_metrics",
)


def gpu_count(cuda_visible_devices: str | None, smi_lines: list[str] | None) -> int:
    """GPUs this head should advertise: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L` lines."""
    if cuda_visible_devices is not None:
        ids = [d for d in cuda_visible_devices.split(",") if d.strip() and d.strip() != "-1"]
        return len(ids)
    return sum(1 for line in smi_lines or [] if line.startswith("GPU "))


def detect_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    lines = None
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            lines = out.stdout.splitlines() if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            lines = []
    return gpu_count(os.environ.get("CUDA_VISIBLE_DEVICES"), lines)


def node_env(address: str, token_path: str, tag: str, tls: dict | None = None) -> dict[str, str]:
    """Environment of `ray start` on any node (inherited by every Ray process and worker)."""
    return {
        **client_env(address, token_path, tls),
        # bounded logs: a component that logs in a loop (seen once in testing: tens of GB in minutes)
        # must not fill the disk of a long serve; 100 MB per file, 3 backups
        "RAY_ROTATION_MAX_BYTES": str(100 * 1024 * 1024),
        "RAY_ROTATION_BACKUP_COUNT": "3",
        supervisor.TAG_VAR: tag,
    }


def head_env(ports: dict[str, int], token_path: str, tag: str, node_ip: str = LOOPBACK, tls: dict | None = None) -> dict[str, str]:
    """Environment of `ray start --head`."""
    return {
        **node_env(f"{node_ip}:{ports['gcs']}", token_path, tag, tls),
        # ports Ray has no flag for (dashboard.consts / autoscaler constants)
        "DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"]),
        "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"]),
    }


def node_argv(ports: dict[str, int], temp_dir: str, num_gpus: int, num_cpus: int | None) -> list[str]:
    """`ray start` flags every node takes: the ports of its own servers, temp dir and resources."""
    argv = [
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--metrics-export-port={ports['metrics_export']}",
        f"--dashboard-agent-listen-port={ports['dashboard_agent_http']}",
        f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--temp-dir={temp_dir}",
        f"--num-gpus={num_gpus}",
        "--disable-usage-stats",
    ]  # fmt: skip
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    return argv


def head_argv(ray_bin: str, ports: dict[str, int], temp_dir: str, num_gpus: int, num_cpus: int | None,
              node_ip: str = LOOPBACK, dashboard: bool = True) -> list[str]:  # fmt: skip
    """The dashboard, when there is one, stays on loopback in every case: only this machine needs it.
    ``dashboard=False``: `--include-dashboard=false` (no dashboard process; Ray's agents still run)."""
    web = [f"--dashboard-host={LOOPBACK}", f"--dashboard-port={ports['dashboard']}"] if dashboard else ["--include-dashboard=false"]
    return [
        ray_bin, "start", "--head",
        f"--node-ip-address={node_ip}",
        f"--port={ports['gcs']}",
        *web,
        f"--ray-client-server-port={ports['client_server']}",
        *node_argv(ports, temp_dir, num_gpus, num_cpus),
    ]  # fmt: skip


def ray_executable() -> str:
    here = Path(sys.executable).with_name("ray")
    found = str(here) if here.exists() else shutil.which("ray")
    if not found:
        raise UserError("the `ray` command is not installed next to this Python or on PATH; install the stack (ray[default]) first")
    return found


def runs(p: supervisor.ProcInfo, name: str) -> bool:
    """Whether ``p`` runs Ray's binary ``name`` (gcs_server, raylet), started by its full path."""
    return p.cmdline.split(" ")[0].endswith("/" + name)


@dataclasses.dataclass
class Head:
    """A running Ray node started by rftstack (a head, or with ``role="worker"`` a worker node),
    as recorded in its state file. ``address`` is the head's GCS address (what clients dial)."""

    address: str
    ports: dict
    temp_dir: str
    token_path: str
    tag: str
    num_gpus: int
    started_at: float
    dashboard_url: str = ""
    resources: dict = dataclasses.field(default_factory=dict)
    node_ip: str = LOOPBACK
    role: str = "head"
    tls: dict = dataclasses.field(default_factory=dict)
    wildcard_ports: dict = dataclasses.field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return client_env(self.address, self.token_path, self.tls)

    def processes(self) -> list[supervisor.ProcInfo]:
        return supervisor.tagged(self.tag)

    def main_pid(self) -> int | None:
        """The process the node lives and dies with: the GCS on a head, the raylet on a worker."""
        name = "gcs_server" if self.role == "head" else "raylet"
        for p in self.processes():
            if runs(p, name):
                return p.pid
        return None

    def gcs_pid(self) -> int | None:
        return self.main_pid() if self.role == "head" else None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("RESOURCES " + json.dumps(ray.cluster_resources()))
print("NODES " + json.dumps([{"ip": n["NodeManagerAddress"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]))
ray.shutdown()
"""


def probe_cluster(address: str, env: dict, timeout: float = 90) -> dict:
    """Connect a real Ray driver to ``address``: {"resources": ..., "nodes": [...]}, or a UserError."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, address], env=env, capture_output=True, text=True, timeout=timeout,
            start_new_session=True,  # a Ctrl-C meant for rftstack must not kill the probe
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"the Ray head at {address} did not answer within {timeout:.0f} s; see its logs") from None
    found = {}
    for line in out.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("RESOURCES", "NODES"):
            found[key.lower()] = json.loads(rest)
    if len(found) == 2:
        return found
    last = (out.stderr.strip().splitlines() or ["no output"])[-1]
    raise UserError(f"the Ray head at {address} refused a driver ({last}); see its logs")


def probe(address: str, env: dict, timeout: float = 90) -> dict:
    """Connect a real Ray driver to ``address``; returns cluster resources or raises UserError."""
    return probe_cluster(address, env, timeout)["resources"]


class DriverCheck:
    """``probe`` of a started head in a thread: a real driver connects while the caller goes on (serve
    starts trinity meanwhile). ``failure()`` is the probe's one-sentence UserError once it failed."""

    def __init__(self, head: Head, env: dict | None = None, progress=lambda msg: None):
        self.head, self.env, self.progress = head, driver_env(head, env), progress
        self.error: str | None = None
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="ray-driver-check", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.head.resources = probe(self.head.address, self.env)
        except UserError as exc:
            self.error = str(exc)
            return
        self.progress(f"Ray head answered a driver at {self.head.address} ({time.monotonic() - self.t0:.0f} s after `ray start` returned)")

    def failure(self) -> str | None:
        return self.error


def write_token(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def with_retry(launch, *, attempts: int = 2, progress=lambda msg: None):
    """Run ``launch()`` (a node start); a failed start is cleaned up by it and retried once with
    fresh ports, since a loaded machine can miss Ray's internal start-up deadlines."""
    for i in range(attempts):
        try:
            return launch()
        except UserError as exc:
            if i + 1 == attempts or getattr(exc, "final", False):
                raise
            progress(f"Ray start failed, retrying once: {str(exc).splitlines()[0]}")
    raise AssertionError("unreachable")


def start(*, attempts: int = 2, **kwargs) -> Head:
    """Start a head (see _start_once)."""
    ray_bin = ray_executable()
    return with_retry(lambda: _start_once(ray_bin=ray_bin, **kwargs), attempts=attempts, progress=kwargs.get("progress", lambda m: None))


class Cancelled(UserError):
    """`ray start` was stopped before it returned, because its caller gave up on the node (``cancel``
    set); the node's processes are stopped and its temp dir removed. ``node``: the node it was."""

    def __init__(self, node: Head):
        super().__init__(f"the start of the Ray {node.role} at {node.address} was cancelled", 1)
        self.node = node
        self.final = True  # never retried


def launch(node: Head, argv: list[str], env: dict, log_path: Path, progress, then: str = "waiting until the cluster answers a driver",
           cancel: threading.Event | None = None) -> None:  # fmt: skip
    """Run `ray start` for ``node``; on failure stop what it left and raise a UserError with the log's tail.
    ``then``: what happens next, for the progress line. ``cancel``: once set, `ray start` and what it
    started are stopped (every process carries the node's tag) and ``Cancelled`` is raised."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        rc: int | None = None
        while rc is None and time.monotonic() - t0 < 180:
            if cancel is not None and cancel.is_set():
                stop(node, timeout=0, remove_temp=True)  # `ray start` itself carries the tag too
                proc.wait()
                raise Cancelled(node)
            try:
                rc = proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        if rc is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        stop(node)
        text = Path(log_path).read_text()
        tail = "\n".join(text.splitlines()[-15:])
        exc = UserError(f"`ray start` failed (exit {rc}); its log {log_path} ends with:\n{tail}", 1)
        if "InvalidAuthToken" in text:
            exc = UserError(f"the Ray head at {node.address} refused this node's token (Ray: InvalidAuthToken); "
                            f"copy the head's auth_token file again (log: {log_path})", 1)  # fmt: skip
            exc.final = True  # the same token is refused again: no retry
            shutil.rmtree(node.temp_dir, ignore_errors=True)  # Ray wrote nothing there worth keeping
        raise exc
    progress(f"Ray {node.role} processes up after {time.monotonic() - t0:.0f} s; {then}")


def _start_once(
    *,
    ray_bin: str,
    state_dir: Path,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    log_path: Path | None = None,
    progress=lambda msg: None,
    env: dict | None = None,
    node_ip: str = LOOPBACK,
    tls: dict | None = None,
    driver_check: bool = True,
    dashboard: bool = True,
    cancel: threading.Event | None = None,
) -> Head:
    """Start a head on ``node_ip`` (loopback by default); its token, state and `ray start` log live in ``state_dir``.

    `ray start` returns once the head's node is registered with its GCS (Ray's node.py waits for
    that, over the token-checked GCS client). ``driver_check``: then also wait until a real driver
    connects (``probe``); False leaves that to the caller (``DriverCheck``), off its critical path.
    ``dashboard=False``: no dashboard (``Head.dashboard_url`` is then empty). ``cancel``: see ``launch``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), node_ip)))
    # Ray's unix sockets live under --temp-dir and must stay under ~107 bytes: keep it short.
    temp_dir = tempfile.mkdtemp(prefix="rfts-ray-", dir="/tmp")
    token_path = state_dir / "auth_token"
    write_token(token_path)
    tag = f"ray-head-{uuid.uuid4().hex[:12]}"
    gpus = detect_gpus() if num_gpus is None else num_gpus
    argv = head_argv(ray_bin, ports, temp_dir, gpus, num_cpus, node_ip, dashboard)
    log_path = log_path or state_dir / "ray-start.log"
    head = Head(f"{node_ip}:{ports['gcs']}", ports, temp_dir, str(token_path), tag, gpus, time.time(),
                f"http://{LOOPBACK}:{ports['dashboard']}" if dashboard else "", node_ip=node_ip, tls=dict(tls or {}))  # fmt: skip
    full_env = driver_env(head, env)
    progress(f"starting Ray head on {head.address} ({gpus} GPU(s), {'dashboard ' + head.dashboard_url if dashboard else 'no dashboard'}, temp dir {temp_dir})")
    t0 = time.monotonic()
    launch(head, argv, full_env, log_path, progress,
           then="waiting until the cluster answers a driver" if driver_check else "a driver's connection is tried in the background",
           cancel=cancel)  # fmt: skip
    if driver_check:
        try:
            head.resources = probe(head.address, full_env)
        except UserError:
            stop(head)
            raise
    head.wildcard_ports = wildcard_ports(head)
    if driver_check:
        progress(f"Ray head answers at {head.address} after {time.monotonic() - t0:.0f} s")
    return head


def driver_env(head: Head, env: dict | None = None) -> dict[str, str]:
    """The environment of the head's `ray start` and of a driver checking it: ``env`` (default
    os.environ) plus the head's variables, its tag included (a probe is stopped with the head)."""
    full = {**(os.environ if env is None else env), **head_env(head.ports, head.token_path, head.tag, head.node_ip, head.tls or None)}
    full.pop("RAY_AUTH_TOKEN", None)  # the token file is the one source
    return full


WORKER_PORT_RANGE = (10002, 19999)  # `ray start`'s --min-worker-port/--max-worker-port defaults


def wildcard_ports(node: Head) -> dict[str, int]:
    """The node's own ports (``node.ports``) that its processes listen on at a wildcard address
    (0.0.0.0 or ::), read in this network namespace: none on a loopback head; on a cluster node
    Ray's gRPC servers and metrics endpoints. (Ray's worker processes bind the wildcard too, each
    on a port of WORKER_PORT_RANGE.)"""
    from rftstack.doctor import netstat

    by_inode = {l.inode: l for l in netstat.listeners() if l.address in ("0.0.0.0", "::")}
    open_ports = {by_inode[i].port for p in node.processes() for i in netstat.socket_inodes(p.pid) if i in by_inode}
    return {name: port for name, port in node.ports.items() if port in open_ports}


def stop(head: Head, timeout: float = 30.0, remove_temp: bool = False, hurry=None) -> supervisor.StopResult:
    """SIGTERM every process of the node, the GCS server once the others are gone; SIGKILL what is
    left after ``timeout``. The order matters: Ray 2.60's gcs_server, given SIGTERM while its
    clients (raylet, the autoscaler's monitor.py, workers) are still connected, waits in
    grpc::Server::Shutdown for calls that never finish, and the monitor's own SIGTERM handler
    waits on that GCS: both stayed until SIGKILL. Stopped last, it leaves in well under a second."""
    result = supervisor.stop(tag=head.tag, first=signal.SIGTERM, grace_s=timeout, term_s=0, kill_s=10, hurry=hurry,
                             last=lambda p: runs(p, "gcs_server"))  # fmt: skip
    if remove_temp:
        shutil.rmtree(head.temp_dir, ignore_errors=True)
    return result


# ---- state file (for `rftstack ray-head` / `rftstack ray-head stop`) ----------------------------


def default_state_dir(role: str = "head") -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "rftstack" / f"ray-{role}"


def save(head: Head, state_dir: Path) -> None:
    from rftstack.run.rundir import write_atomic

    write_atomic(state_dir / f"{head.role}.json", json.dumps(head.to_json(), indent=2) + "\n")


def load(state_dir: Path, role: str = "head") -> Head | None:
    path = state_dir / f"{role}.json"
    try:
        return Head(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path} is not a {role} state file ({exc}); remove it") from None


def running(state_dir: Path, role: str = "head") -> Head | None:
    """The node recorded in ``state_dir`` if its main process (GCS, raylet) is still alive."""
    head = load(state_dir, role)
    return head if head is not None and head.main_pid() is not None else None


# ---- CLI ----------------------------------------------------------------------------------------


def configure_common(parser, role: str) -> None:
    """Arguments `ray-head` and `ray-worker` share."""
    parser.add_argument("action", nargs="?", choices=["start", "stop", "status"], default="start")
    parser.add_argument("--stop", dest="stop_flag", action="store_true", help="same as the `stop` action")
    parser.add_argument("--block", action="store_true", help=f"stay in the foreground; Ctrl-C or SIGTERM stops the {role}")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs to advertise (default: detected)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs to advertise (default: Ray's detection)")
    parser.add_argument("--state-dir", type=Path, default=None, help=f"where the {role}'s state lives (default {default_state_dir(role)})")
    parser.add_argument("--tls-cert", type=Path, default=None, help="this node's TLS certificate (PEM): Ray's RAY_TLS_SERVER_CERT")
    parser.add_argument("--tls-key", type=Path, default=None, help="this node's TLS key (PEM): Ray's RAY_TLS_SERVER_KEY")
    parser.add_argument("--tls-ca", type=Path, default=None, help="the CA that signed every node's certificate: Ray's RAY_TLS_CA_CERT")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    niceness.add_argument(parser, f"this {role} node")


def configure(parser) -> None:
    configure_common(parser, "head")
    parser.add_argument("--listen", metavar="ADDR", default=None,
                        help="serve other nodes on ADDR, a private address of this machine (default: loopback only, no other node)")  # fmt: skip
    parser.add_argument("--allow-public", action="store_true", help="let --listen take a public address (only behind a firewall)")


def tls_from_args(args) -> dict[str, str]:
    from rftstack.doctor import cluster_net

    env, problem = cluster_net.tls_env(args.tls_cert, args.tls_key, args.tls_ca)
    if problem:
        raise UserError(problem)
    return env


def listen_address(args) -> str:
    """The head's node address: loopback, or ``--listen`` once it passed the checks."""
    from rftstack.doctor import cluster_net

    if args.listen is None:
        return LOOPBACK
    problem = cluster_net.listen_problem(args.listen, allow_public=args.allow_public, local=_is_local(args.listen))
    if problem:
        raise UserError(problem)
    return args.listen


def _is_local(addr: str) -> bool:
    from rftstack.doctor import cluster_net

    try:
        return cluster_net.is_local_address(addr)
    except (OSError, ValueError):
        return False


def report(head: Head, args, **extra) -> None:
    info = {**head.to_json(), "env": head.env(), "pids": [p.pid for p in head.processes()], **extra}
    if args.json:
        print(json.dumps(info), flush=True)
        return
    state = "already running" if extra.get("already_running") else "running"
    if head.role == "worker":
        print(f"Ray worker node {state} at {head.node_ip}, joined to the head at {head.address} (token auth{', TLS' if head.tls else ''})")
    elif head.node_ip == LOOPBACK:
        print(f"Ray head {state} at {head.address} (loopback only, token auth)")
    else:
        print(f"Ray head {state} at {head.address} (private address, token auth{', TLS' if head.tls else ''})")
        print(f"  other nodes join with: rftstack ray-worker --address {head.address} --token-file COPY_OF_{Path(head.token_path).name}")
    if head.wildcard_ports:
        lo, hi = WORKER_PORT_RANGE
        named = ", ".join(f"{k} {v}" for k, v in head.wildcard_ports.items())
        print(f"  Ray 2.60 binds these on every interface (it has no setting for it): {named}, and its workers' ports {lo}-{hi}; "
              "let only the private network reach them (docs/cluster.md)")  # fmt: skip
    if "worker_niceness" in extra:
        print(f"  its Ray workers (every actor, and what an actor forks) run at niceness {extra['worker_niceness']}")
    if head.role == "head":
        print(f"  dashboard: {head.dashboard_url}   token file: {head.token_path}")
    print("  connect with:")
    for k, v in head.env().items():
        print(f"    export {k}={v}")
    sys.stdout.flush()


def status_or_stop(args, state_dir: Path, role: str) -> int:
    """The `status` and `stop` actions, the same for a head and a worker."""
    name = f"Ray {role}"
    if args.action == "status":
        node = running(state_dir, role)
        if node is None:
            print(json.dumps({"running": False}) if args.json else f"no {name} running for {state_dir}")
            return 1
        report(node, args, running=True)
        return 0
    node = load(state_dir, role)
    if node is None:
        print(json.dumps({"stopped": False, "reason": f"no {role}"}) if args.json else f"no {name} recorded in {state_dir}")
        return 0
    result = stop(node)
    (state_dir / f"{role}.json").unlink(missing_ok=True)
    left = [p.pid for p in result.left]
    if args.json:
        print(json.dumps({"stopped": not left, "signals": result.signals, "left": left}))
    else:
        print(f"{name} {node.node_ip if role == 'worker' else node.address} stopped" + (f"; still alive: {left}" if left else ""))
    return 1 if left else 0


def run(args) -> int:
    state_dir = (args.state_dir or default_state_dir("head")).absolute()
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    args.action = "stop" if args.stop_flag else args.action
    if args.action in ("status", "stop"):
        return status_or_stop(args, state_dir, "head")
    node_ip = listen_address(args)
    tls = tls_from_args(args)
    existing = running(state_dir)
    if existing is not None:
        report(existing, args, already_running=True)
        return 0
    nice = niceness.asked(args.worker_niceness, os.environ)
    head = start(state_dir=state_dir, num_gpus=args.num_gpus, num_cpus=args.num_cpus, progress=say, node_ip=node_ip, tls=tls,
                 env={**os.environ, **niceness.head_env(nice)})  # fmt: skip
    save(head, state_dir)
    report(head, args, worker_niceness=niceness.effective(nice))
    if not args.block:
        return 0
    return block(head, state_dir, say)


def block(head: Head, state_dir: Path, say) -> int:
    """Stay in the foreground until SIGINT/SIGTERM (then stop the node) or until its main process dies."""
    stop_reason = []

    def on_signal(signum, frame):
        stop_reason.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    say(f"press Ctrl-C to stop the {head.role}")
    while not stop_reason and head.main_pid() is not None:
        time.sleep(0.5)
    died = not stop_reason
    main = "GCS" if head.role == "head" else "raylet"
    say(f"Ray {head.role} {main} died; stopping the rest" if died else f"{stop_reason[0]}: stopping the Ray {head.role}")
    result = stop(head)
    (state_dir / f"{head.role}.json").unlink(missing_ok=True)
    if result.left:
        say(f"still alive after SIGKILL: {[p.pid for p in result.left]}")
    return 1 if died or result.left else 0
