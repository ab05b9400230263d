"""What vLLM's EngineCore and worker inherit when Trinity's engine actor starts them, against what they inherit
under bare ``vllm serve``, and whether the same Python work runs as fast in each.

Session Y measured the same vLLM engine, every argument the same, stepping slower inside Trinity's Ray actor
(202-242 engine steps/s at c=64) than under bare ``vllm serve`` (273-279), at any niceness and with its worker
forked or spawned. This benchmark starts the processes the way each launcher does, with no GPU and no model, and
compares what they are given (environment, scheduling, limits, the interpreter's state) and how fast they run a
fixed CPU workload:

- ``vllm-serve``: a plain process imports what ``vllm serve``'s API server imports (``--imports``) and, as vLLM's
  CLI does (``cli_env_setup``), sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``; it spawns the "EngineCore", which
  spawns its "worker".
- ``ray-actor``: an actor on a Ray head started as ``rftstack serve`` starts its own (``rftstack.run.ray_head``,
  Ray's worker niceness unless ``--worker-niceness``), with the variables Trinity's ``vLLMRolloutModel`` sets in its
  actor, imports the same, then spawns the "EngineCore" (vLLM spawns from a Ray actor), which forks its "worker"
  (rftstack's vllm-fork-workers patch, the serve's default).
- ``ray-actor-spawn``: the same, the worker spawned (``RFTSTACK_VLLM_FORK_WORKERS=0``, host step engine3b-fork0).

Each of the six processes describes itself (``describe``) and then runs the workload (``workload``: pure Python
objects and dicts, pickling, allocations from 1 KiB to 256 KiB, small numpy arrays) ``--repeats`` times; the
contexts take turns, ``--rounds`` times, so that the machine's drift falls on all of them. The result lists every
field in which a process differs from its counterpart under ``vllm-serve`` and each workload's best time as a
ratio to ``vllm-serve``'s.

    python bench/process_context.py --out bench/results/cpu-2026-12-05z/context.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import gc
import importlib
import json
import multiprocessing as mp
import os
import pickle
import platform
import resource
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

# Ray reads it when imported: under `uv run` its hook would otherwise start the actor in an environment of its own
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

CONTEXTS = ("vllm-serve", "ray-actor", "ray-actor-spawn")
# how each context starts the EngineCore, and how the EngineCore starts its worker: `vllm serve` spawns both (its CLI
# sets VLLM_WORKER_MULTIPROC_METHOD=spawn); from Trinity's engine actor vLLM spawns the EngineCore, which forks its
# worker (rftstack's vllm-fork-workers patch, the serve's default) or spawns it (RFTSTACK_VLLM_FORK_WORKERS=0)
START = {"vllm-serve": ("spawn", "spawn"), "ray-actor": ("spawn", "fork"), "ray-actor-spawn": ("spawn", "spawn")}
# what Trinity's vLLMRolloutModel.__init__ sets in its actor before vLLM starts (trinity/common/models/vllm_model.py,
# vLLM >= 0.22, use_v1), so that the EngineCore and worker inherit it
TRINITY_ACTOR_ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE": "shm",
    "VLLM_RAY_PER_WORKER_GPUS": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
}
# environment variables whose values are reported (others: only whether they are set), for what they change in a
# process that runs Python, numpy, torch or CUDA
VALUE_PREFIXES = ("RAY_", "VLLM_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "PYTHON", "LD_",
                  "MALLOC_", "GLIBC_", "TOKENIZERS_", "HF_", "TRANSFORMERS_", "OPENBLAS", "KMP_", "NUMEXPR_")
# per run: ports, temp dirs, ids (compared by presence only)
VOLATILE = ("RAY_ADDRESS", "RAY_RAYLET_PID", "RAY_NODE_ID", "RAY_JOB_ID", "RAY_CLIENT_MODE", "RAY_JOB_CONFIG_JSON_ENV_VAR")
PR_GET_TIMERSLACK = 30


def _fd_target(fd: int) -> str:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "closed"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("socket:"):
        return "socket"
    if target == "/dev/null":
        return "/dev/null"
    if target.startswith("/dev/pts") or target.startswith("/dev/tty"):
        return "tty"
    return "file"


def _handler(sig: int) -> str:
    h = signal.getsignal(sig)
    if h is signal.SIG_DFL:
        return "default"
    if h is signal.SIG_IGN:
        return "ignored"
    return "python" if h is not None else "not from python"


def _preloaded() -> list[str]:
    names = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        base = os.path.basename(path)
        if any(k in base for k in ("jemalloc", "tcmalloc", "mimalloc")):
            names.add(base)
    return sorted(names)


def _timerslack_ns() -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None


def _torch_threads() -> list[int] | None:
    torch = sys.modules.get("torch")
    return [torch.get_num_threads(), torch.get_num_interop_threads()] if torch is not None else None


def _env_view(env: dict[str, str]) -> dict[str, str]:
    view = {}
    for k, v in env.items():
        if k in VOLATILE:
            view[k] = "(set)"
        elif k.startswith(VALUE_PREFIXES):
            view[k] = v
        else:
            view[k] = "(set)"
    return view


def describe(role: str) -> dict:
    """This process as the scheduler, the kernel and the interpreter see it."""
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    autogroup = Path("/proc/self/autogroup").read_text().strip() if Path("/proc/self/autogroup").exists() else None
    lim = {name: resource.getrlimit(getattr(resource, name)) for name in
           ("RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_MEMLOCK", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_AS")}
    tools = {}
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tools = {str(i): monitoring.get_tool(i) for i in range(6) if monitoring.get_tool(i)}
    return {
        "role": role,
        "pid": os.getpid(),
        "session_leader": os.getsid(0) == os.getpid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "autogroup_nice": autogroup.split(" nice ")[-1] if autogroup and " nice " in autogroup else None,
        "cgroup": Path("/proc/self/cgroup").read_text().strip(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "sched_policy": os.sched_getscheduler(0),
        "timerslack_ns": _timerslack_ns(),
        "rlimits": {k: [str(x) for x in v] for k, v in lim.items()},
        "preloaded_allocators": _preloaded(),
        "env": _env_view(dict(os.environ)),
        "python": {
            "executable": sys.executable,
            "flags": {k: getattr(sys.flags, k) for k in dir(sys.flags)
                      if not k.startswith("_") and isinstance(getattr(sys.flags, k), int) and getattr(sys.flags, k)},
            "switchinterval_s": sys.getswitchinterval(),
            "recursionlimit": sys.getrecursionlimit(),
            "gc_enabled": gc.isenabled(),
            "gc_threshold": list(gc.get_threshold()),
            "gc_frozen": gc.get_freeze_count(),
            "gc_objects": len(gc.get_objects()),
            "modules": len(sys.modules),
            "ray_imported": "ray" in sys.modules,
            "main_module": os.path.basename(getattr(main, "__file__", "") or "") or None,
            "trace": sys.gettrace() is not None,
            "profile": sys.getprofile() is not None,
            "monitoring_tools": tools,
            "threads": threading.active_count(),
            "faulthandler": faulthandler.is_enabled(),
        },
        # what an imported torch would use for its CPU operators (vLLM's executor sets 1 where OMP_NUM_THREADS is unset)
        "torch_threads": _torch_threads(),
        "signals": {name: _handler(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGUSR1")},
        "open_fds": len(os.listdir("/proc/self/fd")),
        "stdio": {"stdout": _fd_target(1), "stderr": _fd_target(2)},
    }


class _Req:
    """A request's bookkeeping, as a scheduler keeps it (plain attributes, no slots: like vLLM's Request)."""

    def __init__(self, i: int):
        self.request_id = f"chatcmpl-{i:08d}"
        self.num_tokens = 100 + i % 50
        self.num_computed_tokens = i % 97
        self.output_token_ids: list[int] = []
        self.status = "RUNNING"


def _python_step(n: int) -> int:
    reqs = [_Req(i) for i in range(n)]
    budget = {}
    total = 0
    for step in range(64):
        for r in reqs:
            r.output_token_ids.append(step)
            r.num_computed_tokens += 1
            budget[r.request_id] = r.num_tokens - r.num_computed_tokens
        ordered = sorted(reqs, key=lambda r: budget[r.request_id])
        total += len(pickle.dumps({r.request_id: r.output_token_ids[-4:] for r in ordered[:32]}))
    return total


def _alloc_step(n: int) -> int:
    kept = []
    total = 0
    for i in range(n * 16):
        size = 1024 << (i % 9)  # 1 KiB .. 256 KiB
        b = bytearray(size)
        b[0] = 1
        total += len(b)
        if i % 4 == 0:
            kept.append(b)
        if len(kept) > 64:
            kept.clear()
    return total


def _numpy_step(n: int) -> int:
    import numpy as np

    total = 0
    for step in range(64):
        a = np.arange(n * 8, dtype=np.int64)
        idx = np.cumsum(np.ones(n, dtype=np.int32)) - 1
        b = np.concatenate([a[idx], a[:n]])
        total += int(b[-1]) + step
    return total


WORKLOADS = {"python": _python_step, "alloc": _alloc_step, "numpy": _numpy_step}


def workload(repeats: int, size: int = 64) -> dict[str, dict[str, float]]:
    """Each workload ``repeats`` times: the best wall and CPU time in ms (the best is the least disturbed)."""
    out = {}
    for name, fn in WORKLOADS.items():
        fn(size)  # warm: imports, caches
        walls, cpus = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            fn(size)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        out[name] = {"wall_ms": round(min(walls) * 1e3, 3), "cpu_ms": round(min(cpus) * 1e3, 3)}
    return out


def _import_all(imports: list[str]) -> None:
    for name in imports:
        importlib.import_module(name)


def _report(path: Path, role: str, body) -> None:
    """Write (role's context and workload, or the traceback) to ``path`` as JSON: a file rather than a queue, since
    the process's own stderr may be a Ray worker's log that nobody reads and a pipe's buffer holds less than a report."""
    try:
        context, work = body()
        path.write_text(json.dumps({"role": role, "context": context, "workload": work}))
    except BaseException:
        import traceback

        path.write_text(json.dumps({"role": role, "error": traceback.format_exc()}))
        raise


def _worker_main(out_dir: str, imports: list[str], repeats: int) -> None:
    def body():
        _import_all(imports)  # vLLM's worker imports torch and vLLM (inherited when forked)
        return describe("worker"), workload(repeats)

    _report(Path(out_dir) / "worker.json", "worker", body)


def _engine_main(out_dir: str, worker_method: str, imports: list[str], repeats: int) -> None:
    def body():
        _import_all(imports)  # the EngineCore imports vLLM's engine (inherited when forked)
        mine = (describe("engine"), workload(repeats))
        p = mp.get_context(worker_method).Process(target=_worker_main, args=(out_dir, imports, repeats), name="worker")
        p.start()
        p.join()
        return mine

    _report(Path(out_dir) / "engine.json", "engine", body)


def start_pair(engine_method: str, worker_method: str, imports: list[str], repeats: int, timeout_s: float = 900) -> dict:
    """Start the "EngineCore" with ``engine_method`` from this process; it starts its "worker" with
    ``worker_method``; both describe themselves and run the workload. Returns {role: {"context", "workload"}}."""
    with tempfile.TemporaryDirectory(prefix="rfts-ctx-pair-") as out_dir:
        p = mp.get_context(engine_method).Process(target=_engine_main, args=(out_dir, worker_method, imports, repeats),
                                                  name="engine")
        p.start()
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
            raise RuntimeError(f"the engine and worker processes did not finish within {timeout_s:.0f} s")
        got = {}
        for role in ("engine", "worker"):
            f = Path(out_dir) / f"{role}.json"
            if not f.exists():
                raise RuntimeError(f"the {engine_method}ed engine process exited ({p.exitcode}) without the {role}'s report")
            rep = json.loads(f.read_text())
            if "error" in rep:
                raise RuntimeError(f"the {role} process failed:\n{rep['error']}")
            got[role] = {"context": rep["context"], "workload": rep["workload"]}
    return got


def parent_context() -> dict:
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "pid": os.getpid()}


class RayActorContexts:
    """A Ray head started as rftstack serve starts its own, and one actor on it with the variables Trinity's engine
    actor sets, which starts a pair on each ``pair(context)`` call; ``close()`` stops the head."""

    def __init__(self, imports: list[str], worker_niceness: int | None, state_dir: Path):
        from rftstack.run import niceness, ray_head

        self._ray_head = ray_head
        env = {**os.environ, **niceness.head_env(worker_niceness)}
        self.head = ray_head.start(state_dir=state_dir, num_gpus=0, num_cpus=2, env=env, dashboard=False)
        try:
            os.environ.update({k: v for k, v in ray_head.driver_env(self.head).items() if k.startswith("RAY_")})
            import ray

            ray.init(address=self.head.address, log_to_driver=False)

            @ray.remote(num_cpus=0)
            class EngineActor:
                """Trinity's engine actor, as far as the processes it starts can tell. This module is imported in it by
                name (not shipped by value from the driver's __main__), so that the processes it spawns find it."""

                def __init__(self, bench_dir: str, imports: list[str]):
                    sys.path.insert(0, bench_dir)
                    import process_context as pc

                    self.pc = pc
                    os.environ.update(pc.TRINITY_ACTOR_ENV)
                    pc._import_all(imports)  # Trinity's engine actor has vLLM imported before vLLM starts its EngineCore
                    self.imports = imports

                def pair(self, context: str, repeats: int) -> dict:
                    return {"parent": self.pc.parent_context(), **self.pc.start_pair(*self.pc.START[context], self.imports, repeats)}

            self.actor = EngineActor.remote(str(Path(__file__).resolve().parent), imports)
        except BaseException:
            self.close()
            raise

    def pair(self, context: str, repeats: int) -> dict:
        import ray

        return ray.get(self.actor.pair.remote(context, repeats), timeout=900)

    def close(self) -> None:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        finally:
            self._ray_head.stop(self.head, timeout=5, remove_temp=True)


@contextlib.contextmanager
def vllm_cli_env(base: dict[str, str]):
    """The environment `vllm serve` would start from, for this process's own children only: ``base`` (this process's
    before it became a Ray driver, which adds Ray's variables and breakpoint hook) and what vLLM's CLI sets before it
    starts anything (vllm/entrypoints/cli/main.py calls cli_env_setup(): the spawn start method unless the
    environment names one)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(base)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _values(ctx: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for k, v in ctx.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "rlimits":
            flat.update(_values(v, key + "."))
        elif k not in ("pid", "role"):
            flat[key] = v
    return flat


def differences(pairs: dict[str, dict], reference: str = "vllm-serve") -> list[dict]:
    """Every field of a process that differs from the same role's under ``reference``."""
    out = []
    for role in ("engine", "worker"):
        ref = _values(pairs[reference][role]["context"])
        for name, pair in pairs.items():
            if name == reference:
                continue
            mine = _values(pair[role]["context"])
            for key in sorted(set(ref) | set(mine)):
                if ref.get(key) != mine.get(key):
                    out.append({"role": role, "context": name, "field": key,
                                reference: ref.get(key, "(unset)"), name: mine.get(key, "(unset)")})
    return out


def best(rounds: list[dict], role: str) -> dict[str, dict[str, float]]:
    names = rounds[0][role]["workload"].keys()
    return {n: {m: min(r[role]["workload"][n][m] for r in rounds) for m in ("wall_ms", "cpu_ms")} for n in names}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the result's JSON file")
    ap.add_argument("--contexts", default=",".join(CONTEXTS), help=f"comma-separated, of {', '.join(CONTEXTS)}")
    ap.add_argument("--imports", default="vllm.entrypoints.openai.api_server",
                    help="comma-separated modules the launching process and the EngineCore import first "
                         "(vllm serve's API server by default; '' for none)")
    ap.add_argument("--rounds", type=int, default=3, help="turns each context takes (default 3)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each workload a turn (default 5)")
    ap.add_argument("--worker-niceness", type=int, default=None, help="the Ray head's worker niceness (default Ray's)")
    args = ap.parse_args(argv)
    contexts = [c.strip() for c in args.contexts.split(",") if c.strip()]
    unknown = [c for c in contexts if c not in CONTEXTS]
    if unknown or "vllm-serve" not in contexts:
        print(f"process_context: --contexts {args.contexts!r}: give vllm-serve and any of {', '.join(CONTEXTS[1:])}",
              file=sys.stderr)
        return 2
    if args.rounds < 1 or args.repeats < 1:
        print("process_context: --rounds and --repeats must be 1 or more", file=sys.stderr)
        return 2
    imports = [m.strip() for m in args.imports.split(",") if m.strip()]
    base_env = dict(os.environ)  # before Ray's driver adds its variables
    t0 = time.monotonic()
    _import_all(imports)  # as `vllm serve` has before it starts its EngineCore
    print(f"process_context: imported {', '.join(imports) or 'nothing'} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    rounds: dict[str, list[dict]] = {c: [] for c in contexts}
    with tempfile.TemporaryDirectory(prefix="rfts-ctx-") as tmp:
        ray_ctx = (RayActorContexts(imports, args.worker_niceness, Path(tmp) / "head")
                   if any(c.startswith("ray-actor") for c in contexts) else None)
        try:
            for i in range(args.rounds):
                for c in contexts:
                    t = time.monotonic()
                    if c.startswith("ray-actor"):
                        assert ray_ctx is not None
                        pair = ray_ctx.pair(c, args.repeats)
                    else:
                        with vllm_cli_env(base_env):
                            pair = {"parent": parent_context(), **start_pair(*START[c], imports, args.repeats)}
                    rounds[c].append(pair)
                    print(f"process_context: round {i + 1}/{args.rounds} {c}: {time.monotonic() - t:.1f} s", file=sys.stderr)
        finally:
            if ray_ctx is not None:
                ray_ctx.close()
    first = {c: rounds[c][0] for c in contexts}
    result: dict = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "sched_autogroup": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
                    if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None},
        "imports": imports,
        "start_methods": {c: dict(zip(("engine", "worker"), START[c])) for c in contexts},
        "contexts": first,
        "differences": differences(first),
        "workload_best": {c: {role: best(rounds[c], role) for role in ("engine", "worker")} for c in contexts},
        "rounds": {c: [{role: r[role]["workload"] for role in ("engine", "worker")} for r in rounds[c]] for c in contexts},
    }
    ref = result["workload_best"]["vllm-serve"]
    result["ratio_to_vllm_serve"] = {
        c: {role: {n: round(result["workload_best"][c][role][n]["wall_ms"] / ref[role][n]["wall_ms"], 3)
                   for n in ref[role]} for role in ("engine", "worker")} for c in contexts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for d in result["differences"]:
        print(f"{d['context']:>16} {d['role']:>6} {d['field']}: {d['vllm-serve']!r} -> {d[d['context']]!r}")
    for c, roles in result["ratio_to_vllm_serve"].items():
        print(f"{c:>16} wall time of vllm-serve's: " + "; ".join(
            f"{role} " + ", ".join(f"{n} {v:.2f}" for n, v in r.items()) for role, r in roles.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
