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
import time
import uuid
from pathlib import Path

from rftstack.doctor.netstat import free_ports
from rftstack.run import supervisor
from rftstack.errors import UserError

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


def client_env(address: str, token_path: str) -> dict[str, str]:
    """What a process needs to reach this head: its address, the token, and Ray's loopback mode."""
    return {
        "RAY_ADDRESS": address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token_path,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's `uv run` hook: a driver started under `uv run` (as in `uv run rftstack serve`) would
        # upload its working directory (the run directory, whose `ray` link leads into Ray's own temp
        # dir) as a runtime-env package; it grew without bound (65 GB in minutes) and killed the GCS.
        # The environment is already the locked one on this machine: nothing needs uploading.
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    }


def head_env(ports: dict[str, int], token_path: str, tag: str) -> dict[str, str]:
    """Environment of `ray start --head` (inherited by every Ray process and worker)."""
    return {
        **client_env(f"{LOOPBACK}:{ports['gcs']}", token_path),
        # ports Ray has no flag for (dashboard.consts / autoscaler constants)
        "DASHBOARD_METRIC_PORT": str(ports["dashboard_metrics"]),
        "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metrics"]),
        # bounded logs: a component that logs in a loop (seen once in testing: tens of GB in minutes)
        # must not fill the disk of a long serve; 100 MB per file, 3 backups
        "RAY_ROTATION_MAX_BYTES": str(100 * 1024 * 1024),
        "RAY_ROTATION_BACKUP_COUNT": "3",
        supervisor.TAG_VAR: tag,
    }


def head_argv(ray_bin: str, ports: dict[str, int], temp_dir: str, num_gpus: int, num_cpus: int | None) -> list[str]:
    argv = [
        ray_bin, "start", "--head",
        f"--node-ip-address={LOOPBACK}",
        f"--port={ports['gcs']}",
        f"--dashboard-host={LOOPBACK}",
        f"--dashboard-port={ports['dashboard']}",
        f"--ray-client-server-port={ports['client_server']}",
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


def ray_executable() -> str:
    here = Path(sys.executable).with_name("ray")
    found = str(here) if here.exists() else shutil.which("ray")
    if not found:
        raise UserError("the `ray` command is not installed next to this Python or on PATH; install the stack (ray[default]) first")
    return found


@dataclasses.dataclass
class Head:
    """A running head, as recorded in its state file."""

    address: str
    ports: dict
    temp_dir: str
    token_path: str
    tag: str
    num_gpus: int
    started_at: float
    dashboard_url: str = ""
    resources: dict = dataclasses.field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return client_env(self.address, self.token_path)

    def processes(self) -> list[supervisor.ProcInfo]:
        return supervisor.tagged(self.tag)

    def gcs_pid(self) -> int | None:
        for p in self.processes():
            if "gcs_server" in p.cmdline.split(" ")[0]:
                return p.pid
        return None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print("RESOURCES " + json.dumps(ray.cluster_resources()))
ray.shutdown()
"""


def probe(address: str, env: dict, timeout: float = 90) -> dict:
    """Connect a real Ray driver to ``address``; returns cluster resources or raises UserError."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, address], env=env, capture_output=True, text=True, timeout=timeout,
            start_new_session=True,  # a Ctrl-C meant for rftstack must not kill the probe
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"the Ray head at {address} did not answer within {timeout:.0f} s; see its logs") from None
    for line in out.stdout.splitlines():
        if line.startswith("RESOURCES "):
            return json.loads(line[len("RESOURCES ") :])
    last = (out.stderr.strip().splitlines() or ["no output"])[-1]
    raise UserError(f"the Ray head at {address} refused a driver ({last}); see its logs")


def write_token(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def start(*, attempts: int = 2, **kwargs) -> Head:
    """Start a loopback head (see _start_once); a failed start is cleaned up and retried once with
    fresh ports, since a loaded machine can miss Ray's internal start-up deadlines."""
    ray_bin = ray_executable()
    for i in range(attempts):
        try:
            return _start_once(ray_bin=ray_bin, **kwargs)
        except UserError as exc:
            if i + 1 == attempts:
                raise
            kwargs.get("progress", lambda m: None)(f"Ray head start failed, retrying once: {str(exc).splitlines()[0]}")
    raise AssertionError("unreachable")


def _start_once(
    *,
    ray_bin: str,
    state_dir: Path,
    num_gpus: int | None = None,
    num_cpus: int | None = None,
    log_path: Path | None = None,
    progress=lambda msg: None,
    env: dict | None = None,
) -> Head:
    """Start a loopback head; its token, state and `ray start` log live in ``state_dir``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES))))
    # Ray's unix sockets live under --temp-dir and must stay under ~107 bytes: keep it short.
    temp_dir = tempfile.mkdtemp(prefix="rfts-ray-", dir="/tmp")
    token_path = state_dir / "auth_token"
    write_token(token_path)
    tag = f"ray-head-{uuid.uuid4().hex[:12]}"
    gpus = detect_gpus() if num_gpus is None else num_gpus
    full_env = {**(os.environ if env is None else env), **head_env(ports, str(token_path), tag)}
    full_env.pop("RAY_AUTH_TOKEN", None)  # the token file is the one source
    argv = head_argv(ray_bin, ports, temp_dir, gpus, num_cpus)
    log_path = log_path or state_dir / "ray-start.log"
    head = Head(f"{LOOPBACK}:{ports['gcs']}", ports, temp_dir, str(token_path), tag, gpus, time.time(),
                f"http://{LOOPBACK}:{ports['dashboard']}")  # fmt: skip
    progress(f"starting Ray head on {head.address} ({gpus} GPU(s), temp dir {temp_dir})")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(argv) + "\n")
        log.flush()
        try:
            rc = subprocess.run(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=180, start_new_session=True).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = None
    if rc != 0:
        stop(head)
        tail = "\n".join(Path(log_path).read_text().splitlines()[-15:])
        raise UserError(f"`ray start --head` failed (exit {rc}); its log {log_path} ends with:\n{tail}", 1)
    progress(f"Ray head processes up after {time.monotonic() - t0:.0f} s; waiting until it answers a driver")
    try:
        head.resources = probe(head.address, {**full_env, supervisor.TAG_VAR: tag})
    except UserError:
        stop(head)
        raise
    progress(f"Ray head answers at {head.address} after {time.monotonic() - t0:.0f} s")
    return head


def stop(head: Head, timeout: float = 30.0, remove_temp: bool = False, hurry=None) -> supervisor.StopResult:
    """SIGTERM every process of the head, SIGKILL what is left after ``timeout``."""
    result = supervisor.stop(tag=head.tag, first=signal.SIGTERM, grace_s=timeout, term_s=0, kill_s=10, hurry=hurry)
    if remove_temp:
        shutil.rmtree(head.temp_dir, ignore_errors=True)
    return result


# ---- state file (for `rftstack ray-head` / `rftstack ray-head stop`) ----------------------------


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "rftstack" / "ray-head"


def save(head: Head, state_dir: Path) -> None:
    from rftstack.run.rundir import write_atomic

    write_atomic(state_dir / "head.json", json.dumps(head.to_json(), indent=2) + "\n")


def load(state_dir: Path) -> Head | None:
    try:
        return Head(**json.loads((state_dir / "head.json").read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{state_dir / 'head.json'} is not a head state file ({exc}); remove it") from None


def running(state_dir: Path) -> Head | None:
    """The head recorded in ``state_dir`` if its GCS is still alive."""
    head = load(state_dir)
    return head if head is not None and head.gcs_pid() is not None else None


# ---- CLI ----------------------------------------------------------------------------------------


def configure(parser) -> None:
    parser.add_argument("action", nargs="?", choices=["start", "stop", "status"], default="start")
    parser.add_argument("--block", action="store_true", help="stay in the foreground; Ctrl-C stops the head")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs to advertise (default: detected)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs to advertise (default: Ray's detection)")
    parser.add_argument("--state-dir", type=Path, default=None, help=f"where the head's token and state live (default {default_state_dir()})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _report(head: Head, args, **extra) -> None:
    info = {**head.to_json(), "env": head.env(), "pids": [p.pid for p in head.processes()], **extra}
    if args.json:
        print(json.dumps(info), flush=True)
        return
    state = "already running" if extra.get("already_running") else "running"
    print(f"Ray head {state} at {head.address} (loopback only, token auth)")
    print(f"  dashboard: {head.dashboard_url}   token file: {head.token_path}")
    print("  connect with:")
    for k, v in head.env().items():
        print(f"    export {k}={v}")
    sys.stdout.flush()


def run(args) -> int:
    state_dir = (args.state_dir or default_state_dir()).absolute()
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    if args.action == "status":
        head = running(state_dir)
        if head is None:
            print(json.dumps({"running": False}) if args.json else "no Ray head running for " + str(state_dir))
            return 1
        _report(head, args, running=True)
        return 0
    if args.action == "stop":
        head = load(state_dir)
        if head is None:
            print(json.dumps({"stopped": False, "reason": "no head"}) if args.json else f"no Ray head recorded in {state_dir}")
            return 0
        result = stop(head)
        (state_dir / "head.json").unlink(missing_ok=True)
        left = [p.pid for p in result.left]
        if args.json:
            print(json.dumps({"stopped": not left, "signals": result.signals, "left": left}))
        else:
            print(f"Ray head {head.address} stopped" + (f"; still alive: {left}" if left else ""))
        return 1 if left else 0
    existing = running(state_dir)
    if existing is not None:
        _report(existing, args, already_running=True)
        return 0
    head = start(state_dir=state_dir, num_gpus=args.num_gpus, num_cpus=args.num_cpus, progress=say)
    save(head, state_dir)
    _report(head, args)
    if not args.block:
        return 0
    return _block(head, state_dir, say)


def _block(head: Head, state_dir: Path, say) -> int:
    stop_reason = []

    def on_signal(signum, frame):
        stop_reason.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    say("press Ctrl-C to stop the head")
    while not stop_reason and head.gcs_pid() is not None:
        time.sleep(0.5)
    died = not stop_reason
    say("Ray head GCS died; stopping the rest" if died else f"{stop_reason[0]}: stopping the Ray head")
    result = stop(head)
    (state_dir / "head.json").unlink(missing_ok=True)
    if result.left:
        say(f"still alive after SIGKILL: {[p.pid for p in result.left]}")
    return 1 if died or result.left else 0
