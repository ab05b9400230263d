"""`rftstack serve`: preflight, a loopback Ray head, then `trinity run` in serve mode, supervised.

Phases (status.json "phase"): preflight -> ray -> config -> trinity -> loading -> ready ->
stopping -> stopped | failed. If trinity or Ray dies, the other is stopped and the exit code is 1;
SIGINT/SIGTERM stop trinity first (SIGINT to its process group, then SIGTERM, then SIGKILL), then
Ray, and every process carrying this serve's tags is gone before the command returns.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from rftstack.doctor import cluster_net, netstat
from rftstack.run import apikey
from rftstack.run import niceness
from rftstack.run import ray_head
from rftstack.run import readiness
from rftstack.run import rundir
from rftstack.run import serve_config
from rftstack.run import supervisor
from rftstack.run import warm_workers
from rftstack.errors import UserError

TRINITY_CMD_VAR = "RFTSTACK_TRINITY_CMD"  # e.g. "python tests/doubles/fake_trinity.py" (tests)
PROGRESS_EVERY_S = 10.0
# how often the loading phase asks the proxy whether it is ready: the endpoint is printed at most this
# long after it answers (a loopback GET that is refused costs about a millisecond)
READY_POLL_S = 0.1
# how often the loading phase looks for a dead trinity, Ray head or engine (a walk over /proc)
DEAD_CHECK_EVERY_S = 1.0


# ---- small decisions (pure) ---------------------------------------------------------------------


def choose_port(flag: int | None, configured: int | None, in_use, free_port) -> tuple[int, str]:
    """The proxy port: --port (0 = any free one), else the config's, else trinity's 8010 or a free
    one when 8010 is taken. Raises UserError when an explicitly asked port is taken."""
    if flag == 0:
        return free_port(), "--port 0: a free port"
    asked = flag if flag is not None else configured
    if asked is not None:
        if in_use(asked):
            src = "--port" if flag is not None else "explorer.proxy_port"
            raise UserError(f"port {asked} ({src}) is already in use on this machine; stop what listens there or pass --port 0")
        return int(asked), "as asked"
    if in_use(serve_config.DEFAULT_PROXY_PORT):
        return free_port(), f"trinity's default {serve_config.DEFAULT_PROXY_PORT} is in use; a free port"
    return serve_config.DEFAULT_PROXY_PORT, "trinity's default"


def trinity_command(environ: dict) -> list[str]:
    if environ.get(TRINITY_CMD_VAR):
        return shlex.split(environ[TRINITY_CMD_VAR])
    here = Path(sys.executable).with_name("trinity")
    if here.exists():
        return [str(here)]
    return [sys.executable, "-m", "trinity.cli.launcher"]


def find_nvcc(environ: dict) -> str | None:
    cuda_home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if cuda_home and Path(cuda_home, "bin", "nvcc").exists():
        return str(Path(cuda_home, "bin", "nvcc"))
    return shutil.which("nvcc", path=environ.get("PATH"))


def cache_dir(environ: dict) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "rftstack"


def model_max_len(model_path: str) -> int | None:
    try:
        data = json.loads(Path(model_path, "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = data.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def unmarked_steps(job_dir) -> list[str]:
    """``global_step_N`` directories of a checkpoint job dir without a ``.full_checkpoint`` marker."""
    try:
        entries = sorted(Path(job_dir).iterdir())
    except OSError:
        return []
    steps = [e for e in entries if e.is_dir() and e.name.startswith("global_step_") and e.name[12:].isdigit()]
    return [e.name for e in sorted(steps, key=lambda e: int(e.name[12:])) if not (e / ".full_checkpoint").exists()]


def guard_checkpoints(job_dir: str) -> None:
    """Refuse a checkpoint dir whose existing steps Trinity's synchronizer would delete
    (trinity/manager/synchronizer.py `_remove_previous_state_dict`: no marker, rmtree)."""
    steps = unmarked_steps(job_dir)
    if steps:
        first = f"{job_dir}/{steps[0]}"
        more = f" (and {len(steps) - 1} more)" if len(steps) > 1 else ""
        raise UserError(
            f"{first}{more} has no .full_checkpoint marker, and Trinity's synchronizer deletes such a directory after it "
            f"loads a newer step; move it out of {job_dir} or mark it to keep (touch {first}/.full_checkpoint)"
        )


def patch_warnings() -> list[str]:
    """The policy's source patches that are not applied to the installed packages."""
    import importlib.util

    from rftstack.stack import patches

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return []
    site = Path(spec.origin).parents[1]
    return [
        f"{name} is {st} in {site} (policy.toml [[patch]] says what goes wrong without it); "
        f"run `{sys.executable} -m rftstack.stack.patches {site}` (part of the install)"
        for name, st in patches.state(site)
        if st != "applied"
    ]


# ---- the shell ----------------------------------------------------------------------------------


class HeadStarter:
    """Start this serve's own Ray head in a thread (``with`` block), overlapping the preflight.

    On leaving the block the thread is joined and the head, if it came up, is handed to the serve
    at once, so that a failing preflight (or a signal) still has it stopped by the teardown. When the
    block raised, a `ray start` still running is not waited for: it and what it started are stopped
    and its temp dir removed (``ray_head.Cancelled``).

    ``driver_check=False``: the block waits for `ray start` only (it returns once the node is
    registered with the GCS, which accepted the token); a real driver's connection is then tried in
    the background (``self.check``, a ``ray_head.DriverCheck``) while the serve goes on.
    ``dashboard``: start Ray's dashboard with the head (on loopback).
    """

    def __init__(self, serve: "Serve", num_gpus: int | None, extra_env: dict[str, str] | None = None, driver_check: bool = True,
                 dashboard: bool = True):  # fmt: skip
        self.serve = serve
        self.num_gpus = num_gpus
        self.extra_env = extra_env or {}
        self.driver_check = driver_check
        self.dashboard = dashboard
        self.cancel = threading.Event()
        self.head: ray_head.Head | None = None
        self.check: ray_head.DriverCheck | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, name="ray-head-start", daemon=True)

    def _start(self) -> None:
        run = self.serve.run
        try:
            # the Explorer actor (Trinity's proxy) inherits the head's environment: the key file's path
            env = {**os.environ, **self.extra_env} if self.extra_env else None
            self.head = ray_head.start(state_dir=run.root / "ray-head", num_gpus=self.num_gpus, env=env,
                                       log_path=run.log("ray-start.log"), progress=self.serve.say,
                                       driver_check=self.driver_check, dashboard=self.dashboard, cancel=self.cancel)  # fmt: skip
            if not self.driver_check:
                self.check = ray_head.DriverCheck(self.head, env, progress=self.serve.say)
        except BaseException as exc:  # re-raised in the main thread by result()
            self.error = exc

    def __enter__(self) -> "HeadStarter":
        self.thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.cancel.set()
        self.thread.join()
        self.serve.head = self.head  # the teardown stops it whatever happened in the block
        if self.head is not None and self.serve.status is not None:
            self.serve.status.update(ray={"address": self.head.address, "tag": self.head.tag})
        if isinstance(self.error, ray_head.Cancelled):
            node = self.error.node
            self.serve.say(f"Ray head start stopped before it returned, its temp dir {node.temp_dir} removed")
            if self.serve.status is not None:
                self.serve.status.update(ray={"address": node.address, "tag": node.tag, "cancelled": True})
        if exc_type is not None:
            self.serve.unused_head = True  # a head nobody used: no grace period, its temp dir removed

    def result(self) -> ray_head.Head:
        if self.error is not None:
            raise self.error
        return self.head


class Stop(Exception):
    """The serve ends before its supervision loop does: why, and the exit code."""

    def __init__(self, reason: str, code: int):
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclasses.dataclass
class Plan:
    """What the serve decided before Ray (the preflight checks the config made from it)."""

    user_cfg: dict
    port: int
    port_why: str
    model_max_len: int | None
    preflight_cfg: dict
    token_path: str | None  # the joined head's token file (--ray-address only)
    key_file: Path | None = None  # --expose: the proxy's API key file
    proxy_env: dict[str, str] = dataclasses.field(default_factory=dict)  # what the proxy reads from the head's environment
    warm_workers: int = 0  # idle Ray workers the own head starts with Trinity's modules imported (warm_workers.py)
    worker_niceness: int | None = None  # the own head's workers' niceness (niceness.py; None: Ray's)
    head_env: dict[str, str] = dataclasses.field(default_factory=dict)  # everything the own head is started with beyond os.environ
    driver_env: dict[str, str] = dataclasses.field(default_factory=dict)  # what `trinity run` gets for the warm workers


@dataclasses.dataclass
class Launch:
    """What trinity runs with."""

    cfg: dict
    env: dict
    port: int
    listen_address: str
    base_url: str
    api_key: str | None


class Serve:
    """One method per phase of docs/serve.md (preflight, ray, config, trinity/loading, ready,
    stopping); each gets what it needs from the one before as arguments."""

    def __init__(self, args):
        self.args = args
        self.run: rundir.RunDir | None = None
        self.status: rundir.Status | None = None
        self.head: ray_head.Head | None = None
        self.driver_check: ray_head.DriverCheck | None = None  # the own head's driver connection, tried in the background
        self.trinity = None
        self.pump = None
        self.engines: dict[int, str] = {}  # vLLM engine processes seen at ready (pid -> title)
        self.unused_head = False
        self.trinity_log: rundir.RotatingLog | None = None
        self.serve_log = None
        self.tag = f"serve-{uuid.uuid4().hex[:12]}"
        self.signals: list[str] = []
        self.t0 = time.monotonic()

    # -- output
    def say(self, msg: str) -> None:
        stamp = f"[{time.monotonic() - self.t0:6.1f}s]"
        print(f"{stamp} {msg}", file=sys.stderr if self.args.json else sys.stdout, flush=True)
        if self.serve_log is not None:
            self.serve_log.write(f"{rundir.now_iso()} {msg}")

    def event(self, name: str, **data) -> None:
        if self.args.json:
            print(json.dumps({"event": name, **data}), flush=True)

    def phase(self, name: str, **fields) -> None:
        if self.status is not None:
            self.status.update(phase=name, **fields)

    def _on_signal(self, signum, frame) -> None:
        # only record it: printing here could re-enter a write the main thread is in the middle of
        self.signals.append(signal.Signals(signum).name)

    def _interrupted(self) -> bool:
        return bool(self.signals)

    def _stop_if_interrupted(self, reason: str = "stopped by signal") -> None:
        if self._interrupted():
            raise Stop(reason, 0)

    # -- main: the phases in order, then the teardown whatever happened
    def main(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._main()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _main(self) -> int:
        supervisor.set_subreaper()
        reason, code = "crashed (a bug in rftstack: see the traceback)", 70
        try:
            reason, code = self._serve()
        except Stop as stop:
            reason, code = stop.reason, stop.code
        except UserError as exc:
            reason, code = str(exc), exc.exit_code
            if self.run is None:
                raise
            self.say(f"error: {exc}")
        finally:
            stopped_clean = self._teardown()
            if self.status is not None:
                if not stopped_clean and code == 0:
                    reason, code = reason + "; some processes survived SIGKILL", 1
                self.phase("stopped" if code == 0 else "failed", exit_reason=reason, exit_code=code, stopped_at=rundir.now_iso())
        if self.run is not None:
            self.say(f"exit {code}: {reason}; run directory {self.run.root}")
            self.event("exit", code=code, reason=reason, run_dir=str(self.run.root))
        return code

    def _serve(self) -> tuple[str, int]:
        user_cfg = self._open_run()
        self._stop_if_interrupted()
        plan = self._plan(user_cfg)
        self._preflight_and_head(plan)
        self._stop_if_interrupted()
        ray_env, ray_address = self._ray(plan)
        self._stop_if_interrupted()
        launch = self._config(plan, ray_env, ray_address)
        self._start_trinity(launch)
        model = self._wait_ready(launch)
        self._ready(launch, model)
        return self._supervise()

    # -- the run directory and the user's config
    def _open_run(self) -> dict:
        args = self.args
        self.run = rundir.create(args.run_dir, base=args.runs_base)
        self.serve_log = rundir.RotatingLog(self.run.log("serve.log"))
        self.status = rundir.Status(self.run.status, run_dir=str(self.run.root), supervisor_pid=os.getpid(), tag=self.tag)
        self.say(f"run directory {self.run.root}")
        user_cfg, _ = self._user_config()
        return user_cfg

    # -- decisions that do not need Ray; the preflight checks the config trinity will run
    def _plan(self, user_cfg: dict) -> Plan:
        args = self.args
        port, port_why = choose_port(
            args.port,
            serve_config.get(user_cfg, "explorer.proxy_port"),
            in_use=netstat.port_in_use,
            free_port=lambda: ray_head.free_ports(1)[0],
        )
        model_path = serve_config.get(user_cfg, "model.model_path")
        max_len = model_max_len(model_path) if isinstance(model_path, str) else None
        plan = Plan(user_cfg, port, port_why, max_len, preflight_cfg={}, token_path=None)
        plan.preflight_cfg, _ = self._effective(plan, args.ray_address or "auto")
        apikey.check_tls(args.tls_cert, args.tls_key)
        if args.expose:
            if args.ray_address:
                raise UserError("--expose needs this serve's own Ray head (the proxy learns its API key from the head's environment); leave out --ray-address")
            plan.key_file, key, made = apikey.ensure(serve_config.job_dir(plan.preflight_cfg))
            self._announce_key(plan.key_file, key, made, port)
        plan.proxy_env = apikey.proxy_env(plan.key_file, args.tls_cert, args.tls_key)
        if plan.proxy_env and args.ray_address:
            raise UserError("--tls-cert needs this serve's own Ray head (the proxy reads it from the head's environment); leave out --ray-address")
        if args.dashboard and args.ray_address:
            raise UserError("--dashboard starts Ray's dashboard with this serve's own Ray head; leave out --ray-address (the joined head has its own) or --dashboard")
        self._plan_warm_workers(plan)
        self._plan_niceness(plan)
        rundir.write_atomic(self.run.root / "config.preflight.yaml", yaml.safe_dump(plan.preflight_cfg, sort_keys=False))
        if args.ray_address:
            plan.token_path = args.ray_token_path or os.environ.get("RAY_AUTH_TOKEN_PATH")
            if not plan.token_path:
                raise UserError("--ray-address needs the head's token file; pass --ray-token-path or set RAY_AUTH_TOKEN_PATH")
        return plan

    def _plan_warm_workers(self, plan: Plan) -> None:
        args = self.args
        asked = warm_workers.asked(args.warm_workers, os.environ)
        if args.ray_address:
            if args.warm_workers:
                raise UserError("--warm-workers starts idle workers with this serve's own Ray head; leave out --ray-address or --warm-workers")
            return  # no own head: nothing is started with head_env
        plan.warm_workers = warm_workers.actor_count(plan.preflight_cfg) if asked is None else asked
        # the engine actors inherit the head's environment (not trinity's): the loopback settings go there too
        plan.head_env = {**serve_config.loopback_env(), **plan.proxy_env}
        if plan.warm_workers:
            trinity = warm_workers.trinity_env(plan.preflight_cfg, cwd=str(self.run.root), environ=dict(os.environ))
            plan.head_env.update(warm_workers.head_env(trinity, plan.warm_workers))
            plan.driver_env = warm_workers.driver_env(trinity)

    def _plan_niceness(self, plan: Plan) -> None:
        if self.args.ray_address:
            if self.args.worker_niceness is not None:
                raise UserError("--worker-niceness sets the niceness of the workers of this serve's own Ray head; leave out --ray-address "
                                "(the joined head's node was started with its own, `rftstack ray-head --worker-niceness`) or --worker-niceness")  # fmt: skip
            return
        plan.worker_niceness = niceness.asked(self.args.worker_niceness, os.environ)
        plan.head_env.update(niceness.head_env(plan.worker_niceness))

    def _effective(self, plan: Plan, ray_address: str):
        return serve_config.effective(plan.user_cfg, run_dir=str(self.run.root), ray_address=ray_address,
                                      proxy_port=plan.port, expose=self.args.expose, model_max_len=plan.model_max_len)  # fmt: skip

    # -- phase preflight (with an own Ray head starting meanwhile)
    def _preflight_and_head(self, plan: Plan) -> None:
        preflight = str(self.run.root / "config.preflight.yaml")
        # Trinity's own config check (a subprocess, the preflight's slow step) starts at once, beside
        # the machine checks; it is read by the config checks, or stopped unread after a FAIL
        probe = self._early_probe(plan, preflight)
        try:
            if self.args.ray_address:
                self._preflight(None)
                self._preflight(preflight, probe)
            else:
                # an own head starts at once too (`ray start` takes seconds; nothing of the
                # preflight needs it, nor it the preflight): after a FAIL it is stopped at once,
                # its temp dir removed
                if plan.warm_workers:
                    self.say(f"  {plan.warm_workers} idle Ray workers start with the head, importing Trinity's actor modules (--warm-workers 0: none)")
                nice = niceness.effective(plan.worker_niceness)
                self.say(f"  Ray workers (the proxy, the engines and what they fork) run at niceness {nice}"
                         + (" (Ray's default; --worker-niceness 0: as `vllm serve` from the shell)" if plan.worker_niceness is None else ""))
                with HeadStarter(self, self.args.num_gpus, plan.head_env, driver_check=False, dashboard=self.args.dashboard) as starter:
                    self._preflight(None)
                    self._preflight(preflight, probe)
                self.head, self.driver_check = starter.result(), starter.check
        finally:
            if probe is not None:
                probe.cancel()
        guard_checkpoints(serve_config.job_dir(plan.preflight_cfg))

    def _early_probe(self, plan: Plan, preflight: str):
        """Trinity's config subprocess for the preflight's config checks, started now; None when the
        preflight is skipped or would ask it with a GPU count known only after the machine checks."""
        if self.args.skip_doctor:
            return None
        try:
            from rftstack.doctor.checks import config as config_check
        except ImportError:
            return None  # _preflight names what is missing
        if not config_check.cluster_sizes_fixed(plan.preflight_cfg) and self.args.num_gpus is None:
            return None
        self.say("  Trinity's own config check started (a subprocess, beside the machine checks)")
        # the serve's tag: the teardown finds it like every other process of this serve
        return config_check.Probe(preflight, max(1, self.args.num_gpus or 0), env={**os.environ, supervisor.TAG_VAR: self.tag})

    # -- phase ray
    def _ray(self, plan: Plan) -> tuple[dict, str]:
        self.phase("ray")
        self._stop_if_dead()  # a head whose driver check already failed (or whose GCS died): no trinity
        if self.args.ray_address:
            ray_env = ray_head.client_env(self.args.ray_address, str(Path(plan.token_path).absolute()))
            self.say(f"joining the Ray head at {self.args.ray_address} (not started here, not stopped here)")
            return ray_env, self.args.ray_address
        (self.run.root / "ray").symlink_to(self.head.temp_dir)
        ray_env, ray_address = self.head.env(), self.head.address
        dashboard = self.head.dashboard_url or None
        self.say(f"Ray dashboard {dashboard} (loopback, asks for the head's token)" if dashboard else "no Ray dashboard (--dashboard starts one)")
        self.phase("ray", ray={"address": ray_address, "ports": self.head.ports, "dashboard": dashboard,
                               "pids": [p.pid for p in self.head.processes()], "tag": self.head.tag,
                               "warm_workers": plan.warm_workers, "worker_niceness": niceness.effective(plan.worker_niceness)})  # fmt: skip
        return ray_env, ray_address

    # -- phase config: the effective config and environment
    def _config(self, plan: Plan, ray_env: dict, ray_address: str) -> Launch:
        self.phase("config")
        cfg, changes = self._effective(plan, ray_address)
        rundir.write_atomic(self.run.config, yaml.safe_dump(cfg, sort_keys=False))
        rundir.write_atomic(self.run.changes, json.dumps([c.__dict__ for c in changes], indent=2, default=str) + "\n")
        self.say(f"proxy port {plan.port} ({plan.port_why})")
        self.say(f"effective config {self.run.config} ({len(changes)} change(s)):")
        for c in changes:
            self.say(f"  {c.render()}")
        for w in serve_config.warnings(cfg, expose=self.args.expose) + patch_warnings():
            self.say(f"WARNING: {w}")
        env, notes = serve_config.environment(dict(os.environ), ray_env=ray_env, tag=self.tag, nvcc=find_nvcc(dict(os.environ)),
                                              expose=self.args.expose, explorer_node=self._node_ip(ray_address))  # fmt: skip
        env.update(plan.proxy_env)
        env.update(plan.driver_env)
        for n in notes:
            self.say(f"env: {n}")
        host = serve_config.get(cfg, "explorer.listen_address")
        scheme = "https" if self.args.tls_cert else "http"
        base_url = f"{scheme}://{serve_config.LOOPBACK if host in ('0.0.0.0', '::') else host}:{plan.port}"
        api_key = plan.key_file.read_text().strip() if plan.key_file else None
        return Launch(cfg, env, plan.port, host, base_url, api_key)

    def _node_ip(self, ray_address: str) -> str:
        """This machine's address in the Ray cluster: the own head's, else the local end of the route
        to the joined head (what Ray itself advertises for a node or a driver here)."""
        if self.head is not None:
            return self.head.node_ip
        try:
            return cluster_net.route_source(*cluster_net.split_address(ray_address))
        except ValueError as exc:
            raise UserError(str(exc)) from None

    # -- phase trinity, then loading
    def _start_trinity(self, launch: Launch) -> None:
        self.phase("trinity", proxy_port=launch.port, listen_address=launch.listen_address)
        argv = trinity_command(dict(os.environ)) + ["run", "--config", str(self.run.config)]
        self.trinity_log = rundir.RotatingLog(self.run.log("trinity.log"))
        self.trinity_log.write(f"# {' '.join(argv)}")
        self.trinity, self.pump = supervisor.spawn(argv, env=launch.env, cwd=str(self.run.root), sink=self.trinity_log.write)
        self.say(f"trinity started (pid {self.trinity.pid}): {' '.join(argv)}; log {self.run.log('trinity.log')}")
        self.phase("loading", trinity_pid=self.trinity.pid)

    def _wait_ready(self, launch: Launch) -> str:
        """The served model's name once the proxy answers; Stop when something died, a signal came or time ran out."""
        timeout = self.args.ready_timeout
        deadline = time.monotonic() + timeout
        t_load, last_progress, next_dead_check = time.monotonic(), 0.0, 0.0
        while True:
            if time.monotonic() >= next_dead_check:
                self._stop_if_dead()
                next_dead_check = time.monotonic() + DEAD_CHECK_EVERY_S
            self._stop_if_interrupted("stopped by signal before ready")
            ready = readiness.check(launch.base_url, timeout=3, api_key=launch.api_key)
            if ready.ok:
                return ready.models[0]
            now = time.monotonic()
            if now > deadline:
                raise Stop(*self._fail(f"the proxy at {launch.base_url} was not ready after {timeout:.0f} s ({ready.detail})"))
            if now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                line = readiness.last_meaningful(self.pump.tail(50)) or "(no output yet)"
                self.say(f"loading {now - t_load:.0f} s: {line}")
            time.sleep(READY_POLL_S)

    # -- phase ready
    def _ready(self, launch: Launch, model: str) -> None:
        cfg, base_url = launch.cfg, launch.base_url
        job = serve_config.job_dir(cfg)
        data = {
            "checkpoint_job_dir": job,
            "proxy_history": serve_config.get(cfg, "explorer.db_url") or f"sqlite:///{job}/buffer/proxy_history.db",
            "explorer_output": f"sqlite:///{job}/buffer/explorer_output.db",
            "experience_buffer": serve_config.get(cfg, "buffer.trainer_input.experience_buffer.path"),
        }
        self.phase("ready", ready_at=rundir.now_iso(), endpoint=f"{base_url}/v1", model=model, data=data,
                   ready_after_s=round(time.monotonic() - self.t0, 1))  # fmt: skip
        self.say(f"READY after {time.monotonic() - self.t0:.0f} s: OpenAI endpoint {base_url}/v1 (model {model!r})")
        self.say(f"  try: {readiness.curl_example(base_url, model)}")
        self.say(f"  feedback: POST {base_url}/feedback, commit: POST {base_url}/commit, metrics: GET {base_url}/metrics")
        for k, v in data.items():
            self.say(f"  data: {k} = {v}")
        if serve_config.get(cfg, "explorer.min_running_model_num") == 0:
            self.say("  note: when a new checkpoint appears the engine reloads it; requests wait during a reload")
        self._watch_engines()
        dashboard = self.head.dashboard_url or None if self.head is not None else None
        self.event("ready", endpoint=f"{base_url}/v1", model=model, run_dir=str(self.run.root), data=data,
                   status=str(self.run.status), dashboard=dashboard)  # fmt: skip

    def _watch_engines(self) -> None:
        # Trinity's proxy answers /health with 200 whatever its engine does, and Trinity lives on when
        # an engine process dies (seen on the H200: a killed VLLM::Worker left serve "ready" for good):
        # watch vLLM's own processes, so a dead engine ends the serve. They are children of Ray's
        # workers, so only a head of this serve's own lets us find them.
        if self.head is not None:
            self.engines = {**supervisor.engine_processes(self.tag), **supervisor.engine_processes(self.head.tag)}
            if self.engines:
                self.say("  watching the engine's processes: " + ", ".join(f"{t} (pid {p})" for p, t in sorted(self.engines.items())))
        else:
            self.say("  note: the engine's processes run under a Ray head not started by this serve, so they are not watched")

    # -- supervise until something dies or a signal comes
    def _supervise(self) -> tuple[str, int]:
        while True:
            self._stop_if_dead()
            if self._interrupted():
                return f"stopped by {self.signals[0]}", 0
            time.sleep(1.0)

    def _stop_if_dead(self) -> None:
        refused = self.driver_check.failure() if self.driver_check is not None else None
        if refused:
            raise Stop(self._fail(refused)[0], 2)  # the exit code it had when serve waited for the check
        dead = self._dead()
        if dead:
            raise Stop(dead, 1)

    def _announce_key(self, key_file, key: str, made: bool, port: int) -> None:
        """The key on the terminal, once, when it is made; never in serve.log or status.json."""
        if not made:
            self.say(f"--expose: the proxy asks for the API key in {key_file} (0600, kept from the first start)")
            return
        import socket

        base = f"{'https' if self.args.tls_cert else 'http'}://{socket.gethostname()}:{port}"
        self.say(f"--expose: made the proxy's API key {key_file} (0600); it is shown here once, for your client:")
        for line in apikey.client_lines(base, key):
            print(f"  {line}", file=sys.stderr if self.args.json else sys.stdout, flush=True)

    def _user_config(self) -> tuple[dict, str]:
        args = self.args
        if args.config:
            path = Path(args.config)
            try:
                text = path.read_text()
            except OSError as exc:
                raise UserError(f"cannot read the config {path} ({exc.strerror}); pass an existing YAML file with -c") from None
            try:
                cfg = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                raise UserError(f"the config {path} is not valid YAML ({str(exc).splitlines()[0]}); fix the file") from None
            shutil.copyfile(path, self.run.user_config)
            self.say(f"config {path.absolute()}")
            return cfg, str(path.absolute())
        from rftstack.run import tinymodel

        model = cache_dir(os.environ) / "tiny-model"
        if not tinymodel.is_complete(model):
            self.say(f"no -c given: generating the tiny model once in {model}")
        tinymodel.ensure(model)
        gpus = ray_head.detect_gpus() if self.args.num_gpus is None else self.args.num_gpus
        cfg = serve_config.default_config(str(model), gpus=gpus)
        self.run.user_config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.say(f"no -c given: serving the embedded default (tiny model {model}), config {self.run.user_config}")
        return cfg, str(self.run.user_config)

    def _preflight(self, config_path: str | None, probe=None) -> None:
        """The doctor's machine groups (``config_path`` None), or everything else about the config
        (``probe``: Trinity's config subprocess, started earlier, for collect)."""
        self.phase("preflight")
        if self.args.skip_doctor:
            if config_path is None:
                self.say("preflight skipped (--skip-doctor)")
            return
        try:
            from rftstack.doctor.collect import CHECKS, MACHINE, collect
        except ImportError as exc:
            raise UserError(
                f"the preflight checks (rftstack.doctor.collect) are not in this install ({exc}); update rftstack, or pass --skip-doctor to serve without them"
            ) from None
        from rftstack.findings import FAIL, render

        if config_path is None:
            self.say("preflight: rftstack doctor (this machine)")
            skip = set(CHECKS) - set(MACHINE)
        else:
            self.say("preflight: rftstack doctor (the config)")
            skip = set(MACHINE)
        token = self.args.ray_token_path or os.environ.get("RAY_AUTH_TOKEN_PATH")
        findings = collect(config_path, skip=skip, progress=lambda m: self.say(f"  {m}"),
                           ray_address=self.args.ray_address, ray_token_path=token if self.args.ray_address else None,
                           trinity_probe=probe)  # fmt: skip
        text = render(findings)
        if text:
            for line in text.splitlines():
                self.say(f"  {line}")
        failed = [f for f in findings if f.status == FAIL]
        if failed:
            raise UserError(f"preflight failed ({len(failed)} check(s): {', '.join(f.check for f in failed)}); fix them or pass --skip-doctor", 1)

    def _dead(self) -> str | None:
        """Why the serve cannot go on (trinity or Ray died), or None."""
        rc = self.trinity.poll() if self.trinity is not None else None
        if rc is not None:
            return self._fail(f"trinity exited with code {rc}")[0]
        if self.head is not None and self.head.gcs_pid() is None:
            return self._fail("the Ray head's GCS died")[0]
        for pid, title in sorted(self.engines.items()):
            if not supervisor.alive(pid):
                return self._fail(f"the vLLM engine's process {title} (pid {pid}) exited while serving, so requests can no longer be answered")[0]
        return None

    def _fail(self, why: str) -> tuple[str, int]:
        self.say(f"FAILED: {why}")
        if self.pump is not None:
            time.sleep(0.3)  # let the pump read the last lines
            tail = self.pump.tail(25)
            if tail:
                self.say(f"last lines of {self.run.log('trinity.log')}:")
                for line in tail:
                    self.say(f"  | {readiness.clean(line)}")
        return why, 1

    def _teardown(self) -> bool:
        """Stop trinity, then Ray; True when nothing of this serve is left."""
        if self.run is None:
            return True
        self.phase("stopping")
        if self.signals:
            self.say(f"{self.signals[0]} received: stopping (send it again to skip the grace periods)")
        fast = len(self.signals) > 1
        timeout = self.args.stop_timeout
        clean = True
        if self.trinity is not None:
            if self.trinity.poll() is None:
                self.say(f"stopping trinity (SIGINT to its process group, up to {timeout:.0f} s)")
            res = supervisor.stop(
                tag=self.tag,
                pgid=self.trinity.pid,
                first=signal.SIGINT,
                grace_s=0 if fast else timeout * 0.6,
                term_s=0 if fast else timeout * 0.4,
                keep_reaping=[self.trinity.pid],
                leader=self.trinity.pid,
                hurry=lambda: len(self.signals) > 1,
            )
            try:
                self.trinity.wait(timeout=5)
            except Exception:
                pass
            if res.signals:
                self.say(f"trinity stopped ({', '.join(res.signals)}, {res.seconds:.1f} s)")
            if res.left:
                clean = False
                self.say(f"still alive after SIGKILL: {[(p.pid, p.cmdline[:60]) for p in res.left]}")
            if self.pump is not None:
                self.pump.join(timeout=5)
        if self.head is not None:
            self.say("stopping the Ray head")
            res = ray_head.stop(self.head, timeout=0 if fast or self.unused_head else 10, hurry=lambda: len(self.signals) > 1,
                                remove_temp=self.unused_head)  # fmt: skip
            if res.left:
                clean = False
                self.say(f"still alive after SIGKILL: {[(p.pid, p.cmdline[:60]) for p in res.left]}")
            else:
                self.say(f"Ray head stopped ({', '.join(res.signals) or 'already gone'}, {res.seconds:.1f} s)")
        supervisor.reap_orphans()
        if self.trinity_log is not None:
            self.trinity_log.close()
        return clean


# ---- CLI ----------------------------------------------------------------------------------------


def configure(parser) -> None:
    parser.add_argument("-c", "--config", help="trinity serve config (YAML); default: the embedded tiny-model smoke test")
    parser.add_argument("--run-dir", help="the run directory (must be new or empty); default ./rftstack-runs/<timestamp>")
    parser.add_argument("--runs-base", default=rundir.DEFAULT_BASE, help="where run directories are made (default ./rftstack-runs)")
    parser.add_argument("--port", type=int, default=None, help="proxy port (default: the config's, else 8010; 0: any free port)")
    parser.add_argument("--expose", action="store_true",
                        help="let the proxy listen on the network (default: 127.0.0.1 only); it then asks for an API key (made on first use)")
    parser.add_argument("--tls-cert", help="serve the proxy over HTTPS with this certificate (PEM; with --tls-key)")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    parser.add_argument("--ray-address", help="join this Ray head instead of starting one (it is not stopped at exit)")
    parser.add_argument("--ray-token-path", help="the token file of the head given by --ray-address")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs for the Ray head (default: detected)")
    parser.add_argument("--dashboard", action="store_true",
                        help="start Ray's dashboard with this serve's own Ray head (loopback only, token auth); default: none, nothing of serve needs it")
    parser.add_argument("--warm-workers", type=int, default=None, metavar="N",
                        help="idle Ray workers this serve's own head starts with Trinity's actor modules imported, so that its actors "
                             "skip those imports (default: $RFTSTACK_WARM_WORKERS, else one per actor of the config; 0: none, as plain Ray and Trinity)")
    niceness.add_argument(parser, "this serve's own head")
    parser.add_argument("--skip-doctor", action="store_true", help="skip the preflight checks (experts)")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the proxy (default 900)")
    parser.add_argument("--stop-timeout", type=float, default=60.0, help="seconds trinity gets to stop before SIGKILL (default 60)")
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout (events ready/exit); progress on stderr")


def run(args) -> int:
    return Serve(args).main()
