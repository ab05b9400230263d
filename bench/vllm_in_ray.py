"""`vllm serve`, exactly as its CLI runs it, but inside one plain Ray actor: no Trinity.

The step between bare `vllm serve` and Trinity's engine actor. On the GPU host bare `vllm serve` stepped faster
(273-279 engine steps/s) than the same engine with the same arguments inside Trinity's Ray actor (202-242). What
is left between them is how Trinity runs vLLM, not an argument: a Ray actor process (Ray's ``default_worker.py``
as ``__main__``, Ray's environment, niceness 15), vLLM's OpenAI server on the async actor's event loop in a thread
of its own, and an EngineCore spawned from that process (in a Ray actor vLLM always spawns:
``vllm.utils.system_utils._maybe_force_spawn``). This script has all of that and nothing of Trinity, so a run of
it beside bare `vllm serve` and the serve says on which side the distance lies.

Spawn itself is no difference: `vllm serve` 0.23 spawns its EngineCore too, as its CLI sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` where the environment has none (``cli_env_setup``, run here as there). What
differs is what the spawned EngineCore starts from: the actor's ``__main__`` and environment.

Same command line as `vllm serve`, less the word ``serve``, plus two options of its own::

    python bench/vllm_in_ray.py MODEL --host 127.0.0.1 --port 8000 [any `vllm serve` options]
        [--ray-num-gpus N] [--worker-niceness N]

It starts a local Ray node of its own (on 127.0.0.1, ``include_dashboard=False``, ``--ray-num-gpus`` GPUs, default 1)
and one async actor, ``VllmServeActor`` (process title ``ray::VllmServeActor``, asking for ``--ray-num-gpus`` GPUs),
whose method does what `vllm serve` does for a single API server (vllm/entrypoints/cli/main.py and cli/serve.py in
vLLM 0.23): the CLI's environment set-up (``cli_env_setup``), the ``serve`` subcommand's parser and checks, then
``run_server``'s steps on the actor's loop, less its process-wide signal handlers (they need the main thread; Trinity's
engine leaves them out too). Multi-API-server, headless, gRPC and data-parallel load-balancing runs are refused.

Before the server starts the driver prints the line the actor made::

    VLLM_IN_RAY pid=<actor pid> in_ray_actor=True multiproc_method=spawn niceness=15 loop=uvloop.Loop main_thread=False
        OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=0

(one line). ``in_ray_actor`` is vLLM's own ``is_in_ray_actor()``, ``multiproc_method`` ``VLLM_WORKER_MULTIPROC_METHOD``
after vLLM's ``_maybe_force_spawn()``: how vLLM will start its EngineCore; then what Ray set in the actor's
environment, which the EngineCore inherits.

``--worker-niceness N`` sets ``RAY_worker_niceness`` before Ray is imported, so that the node's raylet starts its
workers (the actor, and what it starts) at niceness N; without it, Ray's default (15). ``RAY_ENABLE_UV_RUN_RUNTIME_ENV``
is set to 0 before that import too: under `uv run` Ray would otherwise give its workers a freshly synced environment.

SIGTERM or SIGINT: the actor, what it started (the EngineCore, its workers) and the Ray node are stopped, exit 0.
vLLM's server failing inside the actor: one line ``vllm_in_ray: vLLM's server failed inside the Ray actor: <its
exception>`` on stderr (the traceback is in the actor's own output above it), the same cleanup, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any

PREFIX = "vllm_in_ray"
# what Ray sets in its workers' environment where bare `vllm serve` has the caller's, said on the VLLM_IN_RAY line
# ("-": unset): OMP_NUM_THREADS=1 for an actor that asks no CPUs (unless the environment has one), and for one that
# asks a GPU, that GPU alone
RAY_SET_VARS = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def parse_own(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's own options; the rest is `vllm serve`'s command line after ``serve``, in its order."""
    ap = argparse.ArgumentParser(prog="vllm_in_ray.py", allow_abbrev=False,
                                 usage="%(prog)s MODEL [--ray-num-gpus N] [--worker-niceness N] [vllm serve options]",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ray-num-gpus", type=float, default=1.0,
                    help="the GPUs of the local Ray node and of the actor (default 1; 0 for a run without one)")
    ap.add_argument("--worker-niceness", type=int, default=None,
                    help="RAY_worker_niceness for the node: the actor's niceness (default: Ray's, 15)")
    own, rest = ap.parse_known_args(argv)
    if own.ray_num_gpus < 0:
        ap.error("--ray-num-gpus must not be negative")
    if not rest or rest[0].startswith("-"):
        ap.error("give the model first, as to `vllm serve`: vllm_in_ray.py MODEL [options]")
    return own, rest


def failure_line(exc: BaseException) -> str:
    """An exception from ``ray.get`` as one line: the actor's own exception (a RayTaskError's ``cause``), as the
    last line of its traceback reads ("RuntimeError: ..."); its first line where its message has several."""
    cause = getattr(exc, "cause", None)
    err = cause if isinstance(cause, BaseException) else exc
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return text.splitlines()[0] if text else type(err).__name__


class VllmServeActor:
    """One async Ray actor: vLLM's OpenAI server (a single API server, as `vllm serve` runs it) on its event loop."""

    async def prepare(self) -> tuple[int, str]:
        """`vllm serve`'s CLI set-up, then the line that says how vLLM will start its EngineCore from here (and
        where its server will run: this actor's event loop, in a thread of Ray's)."""
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        from vllm.ray.lazy_utils import is_in_ray_actor
        from vllm.utils.system_utils import _maybe_force_spawn

        cli_env_setup()  # vllm/entrypoints/cli/main.py: VLLM_WORKER_MULTIPROC_METHOD=spawn unless set
        _maybe_force_spawn()  # what get_mp_context() does before vLLM starts its EngineCore
        loop = asyncio.get_running_loop()
        return os.getpid(), (f"VLLM_IN_RAY pid={os.getpid()} in_ray_actor={is_in_ray_actor()} "
                f"multiproc_method={os.environ.get('VLLM_WORKER_MULTIPROC_METHOD')} niceness={os.nice(0)} "
                f"loop={type(loop).__module__.split('.')[0]}.{type(loop).__name__} "
                f"main_thread={threading.current_thread() is threading.main_thread()} "
                + " ".join(f"{k}={os.environ.get(k, '-')}" for k in RAY_SET_VARS))

    async def serve(self, vllm_argv: list[str]) -> None:
        """`vllm serve VLLM_ARGV` on this actor's loop (vllm/entrypoints/cli/main.py, then cli/serve.py's single
        API server: ``run_server``, without its SIGTERM handler); returns when the server stops."""
        try:
            await self._serve(vllm_argv)
        except BaseException:
            traceback.print_exc()  # the whole story in the actor's output; the driver says one line
            raise

    async def _serve(self, vllm_argv: list[str]) -> None:
        import vllm.envs as envs
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.entrypoints.openai.api_server import run_server_worker, setup_server
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.utils.system_utils import decorate_logs

        # the parser `vllm` builds, with its `serve` subcommand (make_arg_parser) and that command's checks
        # (validate_parsed_serve_args)
        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        cmd = ServeSubcommand()
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        args = parser.parse_args(["serve", *vllm_argv])
        cmd.validate(args)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        count = args.api_server_count if args.api_server_count is not None else args.data_parallel_size
        others = {"--grpc": getattr(args, "grpc", False), "--headless": args.headless,
                  "--data-parallel-external-lb": args.data_parallel_external_lb,
                  "--data-parallel-rank": args.data_parallel_rank is not None,
                  "--data-parallel-hybrid-lb": args.data_parallel_hybrid_lb,
                  "--data-parallel-start-rank": args.data_parallel_start_rank is not None,
                  "--data-parallel-multi-port-external-lb": args.data_parallel_multi_port_external_lb,
                  "VLLM_RUST_FRONTEND_PATH": bool(envs.VLLM_RUST_FRONTEND_PATH),
                  f"{count} API servers": count != 1}
        if any(others.values()):
            raise ValueError(f"{PREFIX} runs `vllm serve`'s single API server only, not with "
                             f"{', '.join(k for k, v in others.items() if v)}")
        args.api_server_count = None  # serve.py's single-server path

        # api_server.run_server, less `signal.signal(SIGTERM, ...)`: the main thread's only, and this loop runs in
        # a thread of Ray's; so, as in Trinity's engine, serve_http's loop.add_signal_handler does nothing here
        decorate_logs("APIServer", skip_if_decorated=True)
        loop = asyncio.get_running_loop()
        if threading.current_thread() is not threading.main_thread():
            loop.add_signal_handler = lambda *_a, **_k: None  # type: ignore[method-assign]
        listen_address, sock = setup_server(args)
        await run_server_worker(listen_address, sock, args)


ACTOR_TITLE = f"ray::{VllmServeActor.__name__}"  # how Ray titles the actor's process (bench/serve_profile.py samples it)


class Stop:
    """The first SIGTERM or SIGINT, set by its handler: the driver's loop checks it between waits."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handler)
        signal.signal(signal.SIGINT, self.handler)


def wait(ray: Any, ref: Any, stop: Stop) -> bool:
    """Wait for ``ref`` until it is ready (True) or a signal came (False)."""
    while stop.signum is None:
        done, _ = ray.wait([ref], timeout=0.5)
        if done:
            return True
    return False


def descendants(pid: int | None) -> list[Any]:
    import psutil

    if pid is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_processes(procs: list[Any], grace_s: float = 10.0) -> None:
    """SIGTERM (vLLM's EngineCore then stops its workers), then SIGKILL what is left after ``grace_s``."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def say(msg: str) -> None:
    print(f"{PREFIX}: {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    own, vllm_argv = parse_own(sys.argv[1:] if argv is None else argv)
    # both read when Ray is imported or its node starts, so before `import ray`
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    if own.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(own.worker_niceness)
    stop = Stop()
    stop.install()
    import ray

    try:
        ctx = ray.init(address="local", include_dashboard=False, num_gpus=own.ray_num_gpus,
                       _node_ip_address="127.0.0.1", log_to_driver=True)
    except Exception as exc:
        print(f"{PREFIX}: could not start a local Ray node: {failure_line(exc)}", file=sys.stderr, flush=True)
        ray.shutdown()
        return 1
    stop.install()  # ray.init sets a SIGTERM handler of its own in a driver
    say(f"Ray node started, session {ctx.address_info.get('session_dir')}")
    actor = None
    pid: int | None = None
    rc = 0
    try:
        if stop.signum is not None:
            return 0
        actor = ray.remote(num_gpus=own.ray_num_gpus)(VllmServeActor).remote()
        prepared = actor.prepare.remote()
        if not wait(ray, prepared, stop):
            return 0
        pid, line = ray.get(prepared)
        print(line, flush=True)
        serving = actor.serve.remote(vllm_argv)
        if not wait(ray, serving, stop):
            return 0
        ray.get(serving)
        print(f"{PREFIX}: vLLM's server inside the Ray actor stopped on its own", file=sys.stderr, flush=True)
        rc = 1
    except Exception as exc:  # the actor's exception (RayTaskError) or its death (RayActorError)
        time.sleep(1.0)  # the actor's traceback reaches this output through Ray's log monitor
        print(f"{PREFIX}: vLLM's server failed inside the Ray actor: {failure_line(exc)}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        if stop.signum is not None:
            say(f"{signal.Signals(stop.signum).name}: stopping the actor and the Ray node")
        below = descendants(pid)
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # gone already
                pass
        stop_processes(below)
        ray.shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
