"""The cost of Trinity's proxy itself, without a GPU: its real FastAPI app and recorder in front of a
TEST DOUBLE upstream (bench/openai_double.py stands in for the vLLM server, which needs a GPU).

What is real: `trinity.explorer.proxy.app` (FastAPI + uvicorn + httpx forwarding, as Trinity runs
it), `ExplorerService.record_experience` (Trinity's own code: response -> Experience tensors ->
recorder) and Trinity's recorders (`HistoryRecorder` on SQLite via aiosqlite, or
`MemoryHistoryRecorder`). What stands in: the service's model allocation (always the one upstream)
and the upstream itself. So this measures what the proxy adds per request and the most it can
pass per second on this machine's CPU; the GPU run (serve_vs_bare.py) says whether that matters
next to real generation.

Variants (``--variants``):
  hop         forwarding only: record_experience is not called (upstream's forwarding:
              RFTSTACK_PROXY_FAST_FORWARD=0)
  hop-fast    forwarding only with rftstack's fast-forward patch of app.py on
              (patches/trinity-proxy-fast-forward.patch, RFTSTACK_PROXY_FAST_FORWARD=1: a completion
              parsed once with orjson and the upstream's bytes returned as they came)
  memory      Trinity's MemoryHistoryRecorder (in-process dict)
  sqlite      Trinity's default: HistoryRecorder, SQLite file on disk (one transaction per response)
  sqlite-group the same with rftstack's group-commit patch of the recorder on
              (patches/trinity-recorder-group-commit.patch, RFTSTACK_RECORDER_GROUP_COMMIT=1: concurrent
              responses share one transaction); needs the patch installed (`rftstack relax`)
  sqlite-fast sqlite-group with the fast-forward patch on as well (RFTSTACK_PROXY_FAST_FORWARD=1);
              needs both patches installed
  sqlite-gc   sqlite-fast with the gc patch of app.py on as well (patches/trinity-proxy-gc.patch,
              RFTSTACK_PROXY_GC=1: the objects of the proxy's start frozen for the garbage
              collector): what `rftstack relax` installs; needs the three patches installed
  hop-gc      hop-fast with the gc patch on as well
  sqlite-shm  the same SQLite file on /dev/shm (tmpfs): explorer.db_url = sqlite:////dev/shm/...
  sqlite-wal  the SQLite file on disk with `PRAGMA journal_mode=WAL; synchronous=NORMAL` set on every
              new connection (an SQLAlchemy "connect" event: what a named rftstack patch would do)
  sqlite-prebuilt  sqlite-gc with every experience after the first a copy of the first, already built and
              serialized: NOT a way to record (every row holds the first answer's blob), the bound on what building
              and serializing experiences off the proxy's event loop could give; the rows, the recorder and the
              group commit are today's
  sqlite-process  sqlite-gc with the whole recording (parsing, building the experiences, serializing, the SQL
              write) in a process of its own (bench/recorder_process.py, Trinity's record_experience and recorder
              there): the proxy does not parse the upstream's answer, sends its bytes over a Unix socket and
              awaits the rows' commit before it answers, as today; what a patch moving the recording out of the
              proxy's event loop would give (an answer the recorder cannot parse fails with its sentence, where
              today's proxy passes it on). Its CPU is reported beside the proxy's (recorder_cpu_ms_per_response)
  sqlite-process4  the same with four recorder processes on the one SQLite file, each answer to the one with the
              fewest in hand: recording in parallel (each process its own group commit; SQLite's lock takes
              their transactions one at a time); their CPU summed
  sqlite-build  sqlite-gc with patches/trinity-proxy-build-processes.patch on (RFTSTACK_PROXY_BUILD_PROCESSES=1):
              Trinity's own record_experience has one builder process build and serialize the experiences, the
              proxy writes them (its recorder and group commit); what RFTSTACK_PROXY_BUILD_PROCESSES=auto gives
              where the proxy's process has 4 to 7 CPUs (the default is 0, no builder); measured once the builder
              is ready. Its CPU is reported beside the
              proxy's (recorder_cpu_ms_per_response)
  sqlite-build4  the same with four builder processes (RFTSTACK_PROXY_BUILD_PROCESSES=4: what `auto` gives from 16 CPUs)
  sqlite-record  sqlite-gc with the same patch's recording processes (RFTSTACK_PROXY_RECORD_PROCESSES=1): Trinity's
              record_experience sends the answer's numbers to a process that builds, serializes and commits the
              experiences itself (its own recorder and group commit, on the proxy's table); the proxy answers once
              they are committed. Measured once the process is ready; its CPU reported beside the proxy's
  sqlite-record4  the same with four recording processes (what `auto` gives from 16 CPUs)
  sqlite-pool1 the default SQLite file, with the recorder's engine pool at one connection (pool_size=1,
              max_overflow=0): writes queue in the pool instead of in SQLite's busy handler, and no
              overflow connection (with its aiosqlite thread) is opened and closed per response
Every sqlite variant but sqlite-group, sqlite-fast, sqlite-gc, sqlite-prebuilt and the sqlite-process and
sqlite-build ones runs with RFTSTACK_RECORDER_GROUP_COMMIT=0, i.e. upstream's write path whether or not the patch is
installed, every variant but hop-fast, sqlite-fast, hop-gc, sqlite-gc, sqlite-prebuilt and the sqlite-process and
sqlite-build ones with RFTSTACK_PROXY_FAST_FORWARD=0, every variant but hop-gc, sqlite-gc, sqlite-prebuilt and the
sqlite-process and sqlite-build ones with RFTSTACK_PROXY_GC=0, and every variant but the sqlite-build ones with
RFTSTACK_PROXY_BUILD_PROCESSES=0 (the experiences built on the proxy's loop), every one but the sqlite-record ones
with RFTSTACK_PROXY_RECORD_PROCESSES=0, so one run compares them side by side. (sqlite-record and sqlite-build count
as sqlite-process for the group-commit, fast-forward and gc settings above.)
Flags, added to a variant with ``+`` (e.g. ``sqlite+quiet``, ``hop+h11+offer``):
  quiet       uvicorn without its per-request access log (Trinity's `serve_http` keeps uvicorn's
              default, access log on)
  h11         uvicorn's h11 protocol instead of httptools (what `--http h11` selects; Trinity's
              serve_http has no such setting)
  published   uvicorn's httptools protocol as published, without rftstack's
              patches/uvicorn-httptools-ignore-upgrade.patch (loaded from the policy's reverse patch)
  offer       the load generator offers an HTTP/2 upgrade on every request (`Connection: Upgrade,
              HTTP2-Settings`, `Upgrade: h2c`), as the JDK's default HttpClient does; as published,
              httptools then drops every body (all requests fail)
  numeric     the proxy asks for numeric logprobs (RFTSTACK_PROXY_NUMERIC_LOGPROBS=1,
              patches/trinity-proxy-numeric-logprobs.patch; the double answers as the patched vLLM does);
              without it every variant runs with 0 (upstream's logprobs objects)
  actor       the proxy served from a Ray actor's event loop, as Trinity's Explorer serves it (and its engine actor
              vLLM's API server): the child starts a Ray node of its own (no dashboard; its workers at the child's
              niceness, RAY_worker_niceness=0, so that +nice15 stays the niceness on its own) and runs the same
              set-up in an actor; the CPU reported is the actor's process's
  nice15      the proxy process at niceness 15, as Ray starts Trinity's Explorer actor (rftstack.run.niceness;
              `rftstack serve --worker-niceness 0` starts it at 0), the load generator and the upstream at this
              process's: what the proxy keeps of a machine whose CPUs it shares with busy processes

    python bench/proxy_overhead.py --out bench/results/proxy-cpu.json \\
        [--variants hop,memory,sqlite,sqlite-shm,sqlite-wal,sqlite+quiet] [--concurrency 1,8,32,64] [--requests 400]

Per variant it also reports the proxy process's CPU time (all threads, from /proc) per response,
over all levels and their warm-up requests, and the garbage collector's work in the proxy process
over the same window (``gc``: collections per generation, their wall ms, the longest pause; timed
with gc.callbacks in the child, which writes them to a file when it stops).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import loadgen  # noqa: E402
import proc_cpu  # noqa: E402
import recorder_process  # noqa: E402
from rftstack.doctor.netstat import free_port
from rftstack.run import niceness

VARIANTS = ("hop", "hop-fast", "hop-gc", "memory", "sqlite", "sqlite-group", "sqlite-fast", "sqlite-gc", "sqlite-shm",
            "sqlite-wal", "sqlite-pool1", "sqlite-prebuilt", "sqlite-process",
            "sqlite-process4", "sqlite-build", "sqlite-build4", "sqlite-record", "sqlite-record4")
RECORDER_PROCESSES = {"sqlite-process": 1, "sqlite-process4": 4}  # variant: recorder processes
BUILDERS = {"sqlite-build": 1, "sqlite-build4": 4}  # variant: experience builder processes
RECORDERS = {"sqlite-record": 1, "sqlite-record4": 4}  # variant: the patch's recording processes
FLAGS = ("quiet", "h11", "published", "offer", "numeric", "nice15", "actor")
H2C_OFFER = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA"}
UPGRADE_PATCH = "uvicorn-httptools-ignore-upgrade.patch"
GROUP_COMMIT_VAR = "RFTSTACK_RECORDER_GROUP_COMMIT"  # read by the patched recorder
FAST_FORWARD_VAR = "RFTSTACK_PROXY_FAST_FORWARD"  # read by the patched app.py
GC_VAR = "RFTSTACK_PROXY_GC"  # read by the patched app.py
BUILD_VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"  # read by the patched recorder.py
RECORD_VAR = "RFTSTACK_PROXY_RECORD_PROCESSES"  # the same
NUMERIC_VAR = "RFTSTACK_PROXY_NUMERIC_LOGPROBS"  # read by the patched app.py
WARMUP = 8  # unmeasured requests before each level
BUSY_LOOP = "while True:\n    pass\n"  # --busy: one process of other work, one core's worth


def group_commit_setting(variant: str) -> str | None:
    """The value of RFTSTACK_RECORDER_GROUP_COMMIT a variant's proxy runs with (None: no SQLite recorder)."""
    base = variant.partition("+")[0]
    if not base.startswith("sqlite"):
        return None
    return "1" if base in ("sqlite-group", "sqlite-fast", "sqlite-gc", "sqlite-prebuilt", *RECORDER_PROCESSES, *BUILDERS, *RECORDERS) else "0"


def fast_forward_setting(variant: str) -> str:
    """The value of RFTSTACK_PROXY_FAST_FORWARD a variant's proxy runs with."""
    return "1" if variant.partition("+")[0] in ("hop-fast", "sqlite-fast", "hop-gc", "sqlite-gc", "sqlite-prebuilt",
                                                *RECORDER_PROCESSES, *BUILDERS, *RECORDERS) else "0"


def gc_setting(variant: str) -> str:
    """The value of RFTSTACK_PROXY_GC a variant's proxy runs with."""
    return "1" if variant.partition("+")[0] in ("hop-gc", "sqlite-gc", "sqlite-prebuilt", *RECORDER_PROCESSES, *BUILDERS, *RECORDERS) else "0"


def build_setting(variant: str) -> str:
    """The value of RFTSTACK_PROXY_BUILD_PROCESSES a variant's proxy runs with."""
    return str(BUILDERS.get(variant.partition("+")[0], 0))


def record_setting(variant: str) -> str:
    """The value of RFTSTACK_PROXY_RECORD_PROCESSES a variant's proxy runs with."""
    return str(RECORDERS.get(variant.partition("+")[0], 0))


def variants_problem(variants: list[str]) -> str | None:
    """Why ``--variants`` cannot run (one sentence, without the script's name), or None."""
    twice = sorted({v for v in variants if variants.count(v) > 1})
    if twice:
        return f"variant {twice[0]!r} is named twice; name each once (run the script again to repeat it)"
    bad = [v for v in variants if v.partition("+")[0] not in VARIANTS or not flags(v) <= set(FLAGS)]
    if bad:
        return f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)} (optionally +{'/+'.join(FLAGS)})"
    if any(group_commit_setting(v) == "1" for v in variants) and not group_commit_installed():
        return ("variant sqlite-group needs the group-commit patch in the installed Trinity; "
                "run `rftstack relax` (it applies patches/trinity-recorder-group-commit.patch)")
    if any(fast_forward_setting(v) == "1" for v in variants) and not fast_forward_installed():
        return ("variants hop-fast and sqlite-fast need the fast-forward patch in the installed Trinity; "
                "run `rftstack relax` (it applies patches/trinity-proxy-fast-forward.patch)")
    if any(gc_setting(v) == "1" for v in variants) and not app_patch_installed(GC_VAR):
        return ("variants hop-gc and sqlite-gc need the gc patch in the installed Trinity; "
                "run `rftstack relax` (it applies patches/trinity-proxy-gc.patch)")
    if any(build_setting(v) != "0" for v in variants) and not recorder_patch_installed(BUILD_VAR):
        return ("variants sqlite-build and sqlite-build4 need the build-processes patch in the installed Trinity; "
                "run `rftstack relax` (it applies patches/trinity-proxy-build-processes.patch)")
    if any(record_setting(v) != "0" for v in variants) and not recorder_patch_installed(RECORD_VAR):
        return ("variants sqlite-record and sqlite-record4 need the build-processes patch's recording processes in the "
                "installed Trinity; run `rftstack relax` (it applies patches/trinity-proxy-build-processes.patch)")
    if any("numeric" in flags(v) for v in variants) and not app_patch_installed(NUMERIC_VAR):
        return ("flag +numeric needs the numeric-logprobs patch in the installed Trinity; "
                "run `rftstack relax` (it applies patches/trinity-proxy-numeric-logprobs.patch)")
    return None


def fast_forward_installed() -> bool:
    """Whether the installed Trinity's proxy app carries the fast-forward patch (read, not imported)."""
    return app_patch_installed(FAST_FORWARD_VAR)


def app_patch_installed(variable: str) -> bool:
    """Whether the installed Trinity's proxy app reads ``variable`` (a patch of it; read, not imported)."""
    spec = importlib.util.find_spec("trinity")
    if spec is None or not spec.origin:
        return False
    app = Path(spec.origin).parent / "explorer" / "proxy" / "app.py"
    return app.is_file() and variable in app.read_text()


def flags(variant: str) -> set[str]:
    return {f for f in variant.split("+")[1:] if f}


def published_httptools_protocol(workdir: str) -> type:
    """uvicorn's HttpToolsProtocol as published: the installed module with the policy's patch reversed."""
    from rftstack.stack import patches, policy

    import uvicorn

    (p,) = [p for p in policy.load().patches if p.file == UPGRADE_PATCH]
    (fp,) = patches.parse((patches.patches_dir() / p.file).read_text())
    text = patches.undo((Path(uvicorn.__file__).parents[1] / fp.path).read_text(), patches.patches_dir() / p.file, fp.path)
    path = Path(workdir) / "httptools_impl_published.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("httptools_impl_published", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.HttpToolsProtocol


def group_commit_installed() -> bool:
    """Whether the installed Trinity's recorder carries the group-commit patch (read, not imported)."""
    return recorder_patch_installed(GROUP_COMMIT_VAR)


def recorder_patch_installed(variable: str) -> bool:
    """Whether the installed Trinity's recorder reads ``variable`` (a patch of it; read, not imported)."""
    spec = importlib.util.find_spec("trinity")
    if spec is None or not spec.origin:
        return False
    recorder = Path(spec.origin).parent / "explorer" / "proxy" / "recorder.py"
    return recorder.is_file() and variable in recorder.read_text()


def serve_proxy(upstream: str, port: int, variant: str, workdir: str, log: str) -> None:
    """Run Trinity's proxy app on ``port`` (this is the child process): in this process, or with +actor in a Ray
    actor that this process starts on a Ray node of its own (``log``: the child's log, where the actor's lines go)."""
    if "actor" in flags(variant):
        serve_in_ray_actor(upstream, port, variant, workdir, log)
        return
    serve, finish = setup_proxy(upstream, port, variant, workdir)
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on
        pass
    finally:
        finish()


def setup_proxy(upstream: str, port: int, variant: str, workdir: str) -> tuple[Callable[[], Awaitable[None]], Callable[[], None]]:
    """Trinity's proxy app set up for ``variant`` to serve on ``port``: the coroutine function that serves it, and
    what to run once it has stopped (the gc record, the recorders stopped, the rows counted)."""
    os.environ[FAST_FORWARD_VAR] = fast_forward_setting(variant)  # read when app.py is imported
    os.environ[GC_VAR] = gc_setting(variant)  # the same
    os.environ[BUILD_VAR] = build_setting(variant)  # read when recorder.py is imported
    os.environ[RECORD_VAR] = record_setting(variant)  # the same
    os.environ[NUMERIC_VAR] = "1" if "numeric" in flags(variant) else "0"  # the same
    import uvicorn

    from trinity.explorer.proxy import app as proxy_app
    from trinity.explorer.proxy.recorder import HistoryRecorder, MemoryHistoryRecorder
    from trinity.explorer.proxy.service import ExplorerService

    base = variant.partition("+")[0]
    flag = flags(variant)
    group_commit = group_commit_setting(variant)
    if group_commit is not None:
        os.environ[GROUP_COMMIT_VAR] = group_commit  # read when HistoryRecorder is made

    class ServiceStandIn:
        """What app.py calls on the service; the Explorer (engines on a GPU, Ray) is not here."""

        def __init__(self) -> None:
            self.total_experience_count = 0
            if base == "memory":
                self.recorder = MemoryHistoryRecorder()
            elif base.startswith("sqlite"):
                root = "/dev/shm" if base == "sqlite-shm" else workdir
                fd, path = tempfile.mkstemp(prefix="proxy_history-", suffix=".db", dir=root)
                os.close(fd)
                os.unlink(path)
                self.db_path = path
                if base in RECORDER_PROCESSES:  # the recorders are the other processes'
                    self.recording = [start_recorder_process(f"sqlite:///{path}", workdir, i)
                                      for i in range(RECORDER_PROCESSES[base])]  # one after the other
                else:
                    self.recorder = HistoryRecorder(db_url=f"sqlite:///{path}", table_name="proxy_history")

        async def allocate_model(self, increase_count: bool = True):
            return upstream, 0

        if base == "sqlite-prebuilt":
            async def record_experience(self, response, model_version):
                """NOT a way to record (every row gets the first answer's blob): the bound on what building
                and serializing experiences elsewhere could give. The first answer goes through Trinity's
                own code; later ones get a copy of its experience (their own id and model version) whose
                serialize() returns its bytes, and go through the same recorder and group commit."""
                first = getattr(self, "prebuilt", None)
                if first is None:
                    from trinity.common.experience import Experience

                    original = Experience.serialize
                    made: list = []
                    Experience.serialize = lambda exp: made.append(exp) or original(exp)  # type: ignore[method-assign]
                    try:
                        await ExplorerService.record_experience(self, response, model_version)
                    finally:
                        Experience.serialize = original  # type: ignore[method-assign]
                    self.prebuilt = made[0]
                    blob = original(made[0])
                    Experience.serialize = lambda exp: blob  # type: ignore[method-assign]
                    return
                experiences = []
                for _ in response["choices"]:
                    exp = copy.copy(first)
                    exp.eid = copy.copy(first.eid)
                    exp.eid.suffix = response["id"]
                    exp.info = {"model_version": model_version}
                    experiences.append(exp)
                self.total_experience_count += len(experiences)
                await self.recorder.record_history(experiences)
        elif base in RECORDER_PROCESSES:
            async def record_experience(self, response, model_version):
                """The answer's bytes, unparsed (see RawAnswer), to the recorder process with the fewest answers
                in hand; back once committed."""
                client = min((c for _, c in self.recording), key=lambda c: len(c.pending))
                self.total_experience_count += await client.record(response.raw, model_version)
        elif not base.startswith("hop"):
            record_experience = ExplorerService.record_experience  # Trinity's own code
        else:
            async def record_experience(self, response, model_version):
                return None

    if base == "sqlite-wal":
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        @event.listens_for(Engine, "connect")
        def _wal(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    if base == "sqlite-pool1":
        from trinity.buffer.schema import sql_schema

        create = sql_schema.create_async_engine

        def _one_connection(url, **kw):
            return create(url, **{**kw, "pool_size": 1, "max_overflow": 0})

        sql_schema.create_async_engine = _one_connection

    service = ServiceStandIn()
    if base in RECORDER_PROCESSES:  # the proxy leaves the answer unparsed for the recorder processes
        parse, without_traceback = proxy_app._fast_loads, proxy_app._without_traceback
        proxy_app._fast_loads = RawAnswer
        proxy_app._without_traceback = lambda data: without_traceback(
            parse(data.raw) if isinstance(data, RawAnswer) else data)  # an upstream error: parsed, as before
        for child, _ in service.recording:
            print(f"RECORDER_PID {child.pid}", flush=True)
    proxy_app.app.state.service = service
    proxy_app.app.state.temperature = 1.0
    proxy_app.app.state.inference_timeout = 300
    print(f"FAST_FORWARD {int(getattr(proxy_app, '_FAST_FORWARD', False))}", flush=True)  # the module's, as imported
    print(f"NICENESS {os.getpriority(os.PRIO_PROCESS, 0)}", flush=True)
    print(f"NUMERIC_LOGPROBS {int(getattr(proxy_app, '_NUMERIC_LOGPROBS', False))}", flush=True)
    if group_commit is not None and hasattr(service, "recorder"):  # sqlite-process: the recorder process prints it
        print(f"GROUP_COMMIT {int(getattr(service.recorder, '_group_commit', False))}", flush=True)
    gc_events = record_gc()
    print(f"READY {port}", flush=True)

    async def serve() -> None:
        if flag & {"quiet", "h11", "published"}:
            http = "h11" if "h11" in flag else published_httptools_protocol(workdir) if "published" in flag else "auto"
            config = uvicorn.Config(proxy_app.app, host="127.0.0.1", port=port, access_log="quiet" not in flag, http=http)
            print(f"HTTP_PROTOCOL {config.http if isinstance(config.http, str) else 'httptools (published)'}", flush=True)
            await uvicorn.Server(config).serve()
        else:
            await proxy_app.serve_http(proxy_app.app, "127.0.0.1", port)  # as Trinity calls it

    def finish() -> None:
        Path(workdir, f"gc-{variant}.json").write_text(json.dumps(gc_events))
        for child, _ in getattr(service, "recording", []):
            stop_recorder(child)  # its rows are all committed once it has ended
        p = getattr(service, "db_path", None)
        if p and os.path.exists(p):
            import sqlite3

            rows = sqlite3.connect(p).execute("select count(*) from proxy_history").fetchone()[0]
            print(f"ROWS {rows}", flush=True)
            os.unlink(p)

    return serve, finish


class ProxyActor:
    """Trinity's proxy served from a Ray actor's event loop, as Trinity's Explorer serves it (and as its engine actor
    serves vLLM's API server): made a Ray actor by serve_in_ray_actor. Its lines (READY, ROWS...) go to ``log``."""

    async def start(self, upstream: str, port: int, variant: str, workdir: str, log: str) -> None:
        sys.stdout = open(log, "a", buffering=1)  # noqa: SIM115 (the actor's life)
        print(f"PROXY_PID {os.getpid()}", flush=True)
        serve, self.finish = setup_proxy(upstream, port, variant, workdir)
        self.task = asyncio.get_running_loop().create_task(serve())

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            pass
        self.finish()
        sys.stdout.flush()


def serve_in_ray_actor(upstream: str, port: int, variant: str, workdir: str, log: str) -> None:
    """+actor (the child): a Ray node of its own (no dashboard, its workers at this process's niceness), the proxy in
    a ProxyActor on it, until SIGINT; then the actor stopped (its finish) and the node shut down."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)  # the actor appends to this log too: every writer appends, none
    os.dup2(fd, 1)  # writes over another
    os.dup2(fd, 2)
    os.close(fd)
    # read when ray is imported: under `uv run` Ray's hook would ship this tree to workers that `uv run` a fresh,
    # unpatched environment of the lock (rftstack serve turns it off too: rftstack.doctor.cluster_net)
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["RAY_worker_niceness"] = "0"  # Ray's default is 15 (see +nice15 for the niceness on its own)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    import ray

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's sockets live below it
    print(f"RAY_TEMP {temp}", flush=True)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        actor = ray.remote(ProxyActor).remote()
        ray.get(actor.start.remote(upstream, port, variant, workdir, log))  # it says PROXY_PID
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # only here: Ray's processes inherit a mask
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        ray.get(actor.stop.remote(), timeout=60)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


class RawAnswer(dict):
    """The upstream's answer left unparsed by the proxy (variant sqlite-process): an empty dict holding the
    bytes, which only the recorder process parses (and the proxy on an upstream error, as before)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self.raw = raw


def start_recorder_process(db_url: str, workdir: str, index: int = 0) -> tuple[subprocess.Popen, recorder_process.RecorderClient]:
    """bench/recorder_process.py for the proxy's recording (variant sqlite-process), once it listens, and the
    proxy's client of it. It runs in the proxy's process group, so it ends with the proxy."""
    sock, log = (Path(workdir, f"recorder-{os.getpid()}-{index}.{ext}") for ext in ("sock", "log"))
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, str(HERE / "recorder_process.py"), "--socket", str(sock),
                                  "--db-url", db_url], stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.monotonic() + 120
    while "READY" not in log.read_text().splitlines():
        if child.poll() is not None or time.monotonic() > end:
            stop_recorder(child)
            raise RuntimeError(f"the recorder process did not start; its log {log} ends: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    for line in log.read_text().splitlines():  # its GROUP_COMMIT line, into the proxy's log
        if line.startswith("GROUP_COMMIT ") and index == 0:
            print(line, flush=True)
    return child, recorder_process.RecorderClient(str(sock))


def stop_recorder(child: subprocess.Popen) -> None:
    """End the recorder process (SIGINT: it finishes the answers in hand), killing it after 20 s."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def record_gc() -> list[list[float]]:
    """From now on, each collection of this process's garbage collector as [start (time.monotonic,
    the clock the parent reads), generation, wall seconds], appended to the list returned."""
    import gc

    events: list[list[float]] = []
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.monotonic()
        else:
            events.append([started[0], info["generation"], time.monotonic() - started[0]])

    gc.callbacks.append(on_gc)
    return events


def gc_in_window(events: list[list[float]], t0: float, t1: float, responses: int) -> dict:
    """The collections that started between t0 and t1: count and wall ms per generation, the longest
    pause, and the total per response."""
    inside = [e for e in events if t0 <= e[0] <= t1]
    ms = [round(1000 * sum(e[2] for e in inside if e[1] == g), 1) for g in range(3)]
    return {"collections": [sum(1 for e in inside if e[1] == g) for g in range(3)], "wall_ms": ms,
            "max_pause_ms": round(1000 * max((e[2] for e in inside), default=0.0), 1),
            "wall_ms_per_response": round(sum(ms) / responses, 3) if responses else None}


def wait_http(url: str, proc: subprocess.Popen, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {limit_s} s")


def start(argv: list[str], log: Path, nice: int = 0) -> subprocess.Popen:
    """``argv`` in a session of its own, its output in ``log``; ``nice`` above this process's niceness."""
    f = open(log, "w")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=(lambda: os.nice(nice)) if nice else None)


def start_double(logs: Path, delay_s: float = 0.0, name: str = "", per_token_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    """The TEST DOUBLE upstream (openai_double.py) and the URL it prints once it listens; ``name`` goes on its
    command line (``--name``), where a profiler's pattern can find this double and no other; ``per_token_s`` more
    delay per completion token (``--delay-per-token-s``)."""
    log = logs / "double.log"
    double = start([sys.executable, str(HERE / "openai_double.py"), "--delay-s", str(delay_s),
                    *(["--delay-per-token-s", str(per_token_s)] if per_token_s else []),
                    *(["--name", name] if name else [])], log)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        for line in log.read_text().splitlines():
            if line.startswith("URL "):
                return double, line.split()[1]
        time.sleep(0.1)
    stop(double)
    raise RuntimeError("the test double did not start")


def start_proxy(upstream: str, variant: str, workdir: Path, logs: Path) -> tuple[subprocess.Popen, int]:
    """Trinity's proxy (this script's --serve-proxy child) for ``variant``, and its port."""
    port = free_port()
    nice = niceness.RAY_DEFAULT - os.getpriority(os.PRIO_PROCESS, 0) if "nice15" in flags(variant) else 0
    log = logs / f"proxy-{variant}.log"
    proxy = start([sys.executable, str(Path(__file__).resolve()), "--serve-proxy", "--upstream", upstream, "--port", str(port),
                   "--variant", variant, "--workdir", str(workdir), "--log", str(log)], log, nice=max(nice, 0))
    return proxy, port


def recorder_pids(proxy_log: Path) -> list[int]:
    """The recorder processes' pids a proxy printed (the sqlite-process variants), or its experience builders'
    or recorders' (the sqlite-build and sqlite-record variants; Trinity's recorder logs them)."""
    text = proxy_log.read_text()
    builders = re.search(r"Experience (?:builder|recorder)s: \d+ processes .* pids ([\d ]+)", text)
    return [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("RECORDER_PID ")] + (
        [int(p) for p in builders.group(1).split()] if builders else [])


def serving_pid(proxy_log: Path, child: int) -> int:
    """The process that serves the proxy: the Ray actor's (+actor: its PROXY_PID line), else the child itself."""
    pids = [int(ln.split()[1]) for ln in proxy_log.read_text().splitlines() if ln.startswith("PROXY_PID ")]
    return pids[-1] if pids else child


def wait_builders(proxy_log: Path, count: int, proc: subprocess.Popen, limit_s: float) -> None:
    """Until the proxy's ``count`` experience builders (or recorders) are ready (until then the proxy builds and
    records the experiences)."""
    end = time.monotonic() + limit_s
    while len(re.findall(r"Experience (?:builder|recorder) \d+ ready", proxy_log.read_text())) < count:
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"the proxy's {count} experience builders were not ready; its log {proxy_log} ends: "
                               f"{proxy_log.read_text()[-2000:]}")
        time.sleep(0.2)


def recorded_rows(proxy_log: Path) -> int | None:
    """The rows the proxy's store held when it stopped (its last ROWS line), or None (no store, or not stopped)."""
    rows = [ln for ln in proxy_log.read_text().splitlines() if ln.startswith("ROWS ")]
    return int(rows[-1].split()[1]) if rows else None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (from /proc)."""
    import proc_cpu

    return proc_cpu.stat_ticks(Path(f"/proc/{pid}/stat").read_text()) / proc_cpu.TICK


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--variants", default="hop,memory,sqlite,sqlite-shm,sqlite-wal,sqlite+quiet")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=400, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--spread", type=float, default=0.0, metavar="S",
                    help="spread output lengths as loadgen's --max-tokens-spread (0: all --max-tokens)")
    ap.add_argument("--upstream-delay-s", type=float, default=0.0, help="the double's delay per request")
    ap.add_argument("--upstream-delay-per-token-s", type=float, default=0.0,
                    help="the double's further delay per completion token: with --spread, answers of spread lengths "
                         "come back at spread times, as from a GPU (0.27 s and 0 give a burst per round at equal lengths)")
    ap.add_argument("--startup-timeout-s", type=float, default=300.0,
                    help="how long a variant's proxy may take to answer /health; after it, the variant's result says so")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N processes spinning at this process's niceness through every run: other work on the machine "
                         "(the agent, a trainer), which the proxy shares the CPUs with (see +nice15)")
    ap.add_argument("--logs", default=None, help="directory for the child logs (default: next to --out)")
    # internal: the proxy child
    ap.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_proxy:
        serve_proxy(args.upstream, args.port, args.variant, args.workdir, args.log)
        return 0
    if not args.out:
        print("proxy_overhead: --out is required", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v]
    problem = variants_problem(variants)
    if problem:
        print(f"proxy_overhead: {problem}", file=sys.stderr)
        return 2
    if args.busy < 0:
        print("proxy_overhead: --busy takes a number of spinning processes, 0 or more", file=sys.stderr)
        return 2
    for flag, value in (("--upstream-delay-s", args.upstream_delay_s), ("--upstream-delay-per-token-s", args.upstream_delay_per_token_s)):
        if value < 0:
            print(f"proxy_overhead: {flag} takes seconds, 0 or more, not {value}", file=sys.stderr)
            return 2
    levels = loadgen.parse_levels(args.concurrency)
    out = Path(args.out)
    logs = Path(args.logs) if args.logs else out.parent / (out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="proxy-overhead-"))
    result = {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                          "sched_autogroup": proc_cpu.sched_autogroup()},
              "command": " ".join([sys.executable, *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "upstream": "TEST DOUBLE (bench/openai_double.py)", "upstream_delay_s": args.upstream_delay_s,
              "upstream_delay_per_token_s": args.upstream_delay_per_token_s, "max_tokens_spread": args.spread, "runs": {}}

    def run_load(url: str, label: str, headers: dict | None = None) -> dict:
        return asyncio.run(loadgen.run(url, levels=levels, requests=args.requests, max_tokens=args.max_tokens, label=label,
                                       warmup=WARMUP, level_timeout_s=120, spread=args.spread, progress=lambda m: print(m, flush=True),
                                       headers=headers))

    result["busy_processes"] = args.busy
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(args.busy)]
    double, url = start_double(logs, args.upstream_delay_s, per_token_s=args.upstream_delay_per_token_s)
    try:
        result["runs"]["direct"] = run_load(url, "direct to the test double")
        for v in variants:
            proxy, port = start_proxy(url, v, work, logs)
            try:
                t0 = time.monotonic()
                try:
                    wait_http(f"http://127.0.0.1:{port}/health", proxy, args.startup_timeout_s)
                except RuntimeError as exc:  # a result too: e.g. a nice-15 proxy beside busy processes (+nice15, --busy)
                    result["runs"][v] = {"levels": [], "proxy_startup_s": None, "start_error": str(exc)}
                    out.write_text(json.dumps(result, indent=2) + "\n")
                    print(f"proxy ({v}): {exc}", flush=True)
                    continue
                startup = time.monotonic() - t0
                if build_setting(v) != "0" or record_setting(v) != "0":
                    wait_builders(logs / f"proxy-{v}.log", int(build_setting(v)) or int(record_setting(v)), proxy, 300)
                recorders = recorder_pids(logs / f"proxy-{v}.log")
                serving = serving_pid(logs / f"proxy-{v}.log", proxy.pid)
                cpu0, load0 = process_cpu_s(serving), time.monotonic()
                rcpu0 = sum(process_cpu_s(pid) for pid in recorders)
                r = run_load(f"http://127.0.0.1:{port}", f"proxy ({v})", H2C_OFFER if "offer" in flags(v) else None)
                cpu, load1 = process_cpu_s(serving) - cpu0, time.monotonic()
                rcpu = sum(process_cpu_s(pid) for pid in recorders) - rcpu0 if recorders else None
                r["proxy_startup_s"] = round(startup, 2)
            finally:
                stop(proxy)
            answered = sum(lv["ok"] for lv in r["levels"]) + WARMUP * len(r["levels"])
            r["proxy_hosting"] = "ray-actor" if serving != proxy.pid else "process"
            r["proxy_cpu_s"] = round(cpu, 3)
            r["proxy_cpu_ms_per_response"] = round(1000 * cpu / answered, 3) if answered else None
            if rcpu is not None:
                r["recorder_cpu_s"] = round(rcpu, 3)
                r["recorder_cpu_ms_per_response"] = round(1000 * rcpu / answered, 3) if answered else None
            gc_file = work / f"gc-{v}.json"
            if gc_file.exists():
                r["gc"] = gc_in_window(json.loads(gc_file.read_text()), load0, load1, answered)
            log = (logs / f"proxy-{v}.log").read_text().splitlines()
            rows = recorded_rows(logs / f"proxy-{v}.log")
            if rows is not None:
                r["recorded_rows"] = rows
            r["proxy_gc_tuning"] = any("objects frozen for the garbage collector" in ln for ln in log)
            nice = [ln for ln in log if ln.startswith("NICENESS ")]
            if nice:
                r["proxy_niceness"] = int(nice[-1].split()[1])
            fast = [ln for ln in log if ln.startswith("FAST_FORWARD ")]
            if fast:
                r["proxy_fast_forward"] = fast[-1].split()[1] == "1"
            numeric = [ln for ln in log if ln.startswith("NUMERIC_LOGPROBS ")]
            if numeric:
                r["proxy_numeric_logprobs"] = numeric[-1].split()[1] == "1"
            group = [ln for ln in log if ln.startswith("GROUP_COMMIT ")]
            if group:
                r["recorder_group_commit"] = group[-1].split()[1] == "1"
            result["runs"][v] = r
            out.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stop(double)
        for p in busy:
            stop(p)
        shutil.rmtree(work, ignore_errors=True)
    result["summary"] = summary(result)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


def summary(result: dict) -> dict:
    """Per variant and level: req/s and p50 latency, both relative to going direct, and req/s relative
    to the forwarding-only proxy (``vs_hop``) and to upstream's recorder (``vs_sqlite``) when those ran."""
    direct = {lv["concurrency"]: lv for lv in result["runs"]["direct"]["levels"]}
    refs = {ref: {lv["concurrency"]: lv["requests_per_s"] for lv in result["runs"][ref]["levels"]}
            for ref in ("hop", "sqlite") if ref in result["runs"]}
    out = {}
    for name, run in result["runs"].items():
        rows = {}
        for lv in run["levels"]:
            d = direct.get(lv["concurrency"])
            ratios = {f"vs_{ref}": round(lv["requests_per_s"] / per[lv["concurrency"]], 3)
                      for ref, per in refs.items() if name != "direct" and per.get(lv["concurrency"])}
            rows[str(lv["concurrency"])] = {
                "req_s": lv["requests_per_s"],
                "p50_ms": round(1000 * lv["latency_s"]["p50"], 2) if lv["latency_s"]["p50"] is not None else None,
                "vs_direct": round(lv["requests_per_s"] / d["requests_per_s"], 3) if d and d["requests_per_s"] else None,
                "added_p50_ms": round(1000 * (lv["latency_s"]["p50"] - d["latency_s"]["p50"]), 2) if d and lv["latency_s"]["p50"] else None,
                "errors": lv["errors"],
                **ratios,
            }
        if run.get("start_error"):
            rows["start_error"] = run["start_error"]
        if run.get("proxy_cpu_ms_per_response") is not None:
            rows["cpu_ms_per_response"] = run["proxy_cpu_ms_per_response"]
        if run.get("recorder_cpu_ms_per_response") is not None:
            rows["recorder_cpu_ms_per_response"] = run["recorder_cpu_ms_per_response"]
        if run.get("gc"):
            rows["gc_wall_ms_per_response"] = run["gc"]["wall_ms_per_response"]
            rows["gc_max_pause_ms"] = run["gc"]["max_pause_ms"]
        out[name] = rows
    return out


if __name__ == "__main__":
    sys.exit(main())
