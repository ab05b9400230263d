"""Serving through Trinity's proxy against bare `vllm serve`, same model, same GPU, one run (GPU host).

Phases (each hard time-bounded, processes always stopped, results written after every phase):

  bare     `vllm serve MODEL` on loopback: time to ready (start -> /v1/models answers -> first chat
           completion answered), then the load levels twice: plain requests, and requests
           "like the proxy" (logprobs + return_token_ids, which Trinity's proxy adds to every call)
  trinity  `python3 -m rftstack serve -c CONFIG` (the supervised runner): time to ready, the load
           levels through Trinity's proxy, and the same levels sent "like the proxy" straight to
           the vLLM OpenAI server inside Trinity's engine actor (found as the new loopback-reachable
           listener that answers /v1/models): proxy vs engine-direct is the proxy's own cost
  trinity-nogroup
           the trinity phase's start and proxy load with RFTSTACK_RECORDER_GROUP_COMMIT=0 (upstream
           Trinity's recorder write path, one transaction per response), so the group-commit
           patch's effect is measured side by side with bare and `trinity` in one run
  trinity-noff
           the same with RFTSTACK_PROXY_FAST_FORWARD=0 (upstream Trinity's forwarding: httpx, the
           response rebuilt through a dict), so the fast-forward patch's effect is measured side by
           side with bare and `trinity` (which runs with it, the default) in one run
  trinity-nogc
           the same with RFTSTACK_PROXY_GC=0 (Python's garbage collector as it comes in the proxy's
           process, without patches/trinity-proxy-gc.patch), side by side with `trinity` in one run
  trinity-mp
           the same with RFTSTACK_ENGINE_EXECUTOR=mp (vLLM's worker in its own process beside the EngineCore,
           as upstream Trinity; the default, patches/trinity-engine-uni-executor.patch, runs it inside the
           EngineCore): time to ready and the proxy's load, side by side with `trinity` in one run
  trinity-nonumeric
           the same with RFTSTACK_PROXY_NUMERIC_LOGPROBS=0 (the proxy asks for upstream's logprobs objects,
           without patches/trinity-proxy-numeric-logprobs.patch's numeric logprobs), side by side with
           `trinity` in one run
  trinity-mp-fork
           `trinity-mp` with RFTSTACK_VLLM_FORK_WORKERS=1 (patches/vllm-fork-workers.patch: the EngineCore forks
           its worker instead of spawning a fresh interpreter), side by side with `trinity-mp` in one run
  trinity-build
           the same with RFTSTACK_PROXY_BUILD_PROCESSES=auto (patches/trinity-proxy-build-processes.patch: the
           experiences built and serialized in builder processes, one for every 4 CPUs, at most 4), spelled
           out: the default since session AH (until then 0, so `trinity` side by side with it was upstream's)
  trinity-nobuild
           the same with RFTSTACK_PROXY_BUILD_PROCESSES=0: the experiences built on the proxy's event loop, as
           upstream (the `trinity` phase's before session AH), side by side with `trinity` in one run
  trinity-late
           the same with RFTSTACK_PROXY_BUILDERS_EARLY=0: the builder processes start when the proxy's app
           starts, after the models (without patches/trinity-proxy-builders-early.patch, which starts them
           with the Explorer), side by side with `trinity` in one run
  trinity-record
           the same with RFTSTACK_PROXY_RECORD_PROCESSES=auto (the same patch's recording processes: the
           experiences built, serialized and committed by them, one for every 4 CPUs, at most 4)
  trinity-record1
           the same with one recording process (RFTSTACK_PROXY_RECORD_PROCESSES=1): no second process
           waits for SQLite's write lock
  trinity-cold
           time to ready of `rftstack serve` with RFTSTACK_WARM_WORKERS=0 (its own Ray head without
           warm workers, Trinity's job with its runtime_env: every actor in a new process, as plain
           Ray and Trinity), side by side with `trinity` (warm workers, the default) in one run
  manual   the report's steps by hand: `ray start --head` (loopback, explicit ports, private
           temp dir) then `trinity run --config CONFIG`: time to ready only

With --spread S, the bare and proxy phases also run the --spread-levels with output lengths spread
over [M(1-S), M(1+S)] (loadgen's --max-tokens-spread; equal lengths make a level's requests finish
together, the worst case for a proxy that handles responses one at a time).

Time goes to: the per-process log with a "+seconds" stamp on every line (logs/<phase>.log) and the
vLLM phases found in it (weights, torch.compile, CUDA graphs, engine init) in the JSON.

    python bench/serve_vs_bare.py --model /path/model --label tiny --out bench/results/gpu \\
        [--phases bare,trinity,manual] [--budget-s 540]

Writes <out>/serve-<label>.json (all phases), <out>/logs/*.log and <out>/work/ (configs, run dirs).
A later call with the same --label and --out adds its phases to that file (the earlier call is
listed under "earlier_calls"), so one model may be measured over two time-limited calls.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "python"))
import loadgen  # noqa: E402
from proxy_overhead import FAST_FORWARD_VAR, GC_VAR, GROUP_COMMIT_VAR  # noqa: E402

EXECUTOR_VAR = "RFTSTACK_ENGINE_EXECUTOR"  # patches/trinity-engine-uni-executor.patch: mp (default) or uni
WARM_VAR = "RFTSTACK_WARM_WORKERS"  # rftstack serve's default count of warm Ray workers (0: none)
NUMERIC_VAR = "RFTSTACK_PROXY_NUMERIC_LOGPROBS"  # patches/trinity-proxy-numeric-logprobs.patch: 1 (default) or 0
FORK_VAR = "RFTSTACK_VLLM_FORK_WORKERS"  # patches/vllm-fork-workers.patch: 1 (default) or 0
BUILD_VAR = "RFTSTACK_PROXY_BUILD_PROCESSES"  # patches/trinity-proxy-build-processes.patch: 0, auto (default) or N
RECORD_VAR = "RFTSTACK_PROXY_RECORD_PROCESSES"  # the same patch's recording processes: 0 (default), auto or N
EARLY_VAR = "RFTSTACK_PROXY_BUILDERS_EARLY"  # patches/trinity-proxy-builders-early.patch: 1 (default) or 0
from rftstack.doctor.netstat import free_port


def engine_direct_request(env: dict) -> str:
    """What the proxy sends its engine, so what the engine-direct loads send: the fields with numeric logprobs while
    the numeric-logprobs patch is on (its default), the fields with JSON logprobs where ``env`` switches it off.
    Until session AN these loads sent the JSON fields whatever the proxy sent (a costlier request for the engine)."""
    return loadgen.NUMERIC if env.get(NUMERIC_VAR, "1") != "0" else "json"


# the phases that run `trinity` with variables set (a patch switched off, or another executor):
# name -> {variable: value}; the runner, its Ray head and Trinity's actors inherit them
SWITCHED = {
    "trinity-nogroup": {GROUP_COMMIT_VAR: "0"},
    "trinity-noff": {FAST_FORWARD_VAR: "0"},
    "trinity-nogc": {GC_VAR: "0"},
    "trinity-mp": {EXECUTOR_VAR: "mp", FORK_VAR: "0"},  # mp with its worker spawned (upstream's start method)
    "trinity-nonumeric": {NUMERIC_VAR: "0"},
    "trinity-mp-fork": {EXECUTOR_VAR: "mp", FORK_VAR: "1"},  # the defaults since session N, spelled out
    "trinity-uni": {EXECUTOR_VAR: "uni"},  # vLLM's uni executor (the default until session N)
    "trinity-build": {BUILD_VAR: "auto"},  # the default since session AH, spelled out
    "trinity-nobuild": {BUILD_VAR: "0"},  # the experiences built on the proxy's loop, as upstream
    "trinity-late": {EARLY_VAR: "0"},  # the builders started with the proxy's app, after the models
    "trinity-record": {RECORD_VAR: "auto"},
    "trinity-record1": {RECORD_VAR: "1"},
    "trinity-cold": {WARM_VAR: "0"},
}
LOADED = ("trinity", *(n for n in SWITCHED if n != "trinity-cold"))  # the phases that get the proxy's load
PHASES = ("bare", "trinity", *SWITCHED, "manual")

# vLLM / Trinity log lines that say where start-up time goes: name -> regex (first group: seconds)
MARKERS = {
    "weights_loaded": r"Loading weights took ([\d.]+) seconds",
    "model_loading": r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds",
    "dynamo_transform": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile_range": r"Compiling a graph for compile range .* takes ([\d.]+) s",
    "compiled_graph_loaded": r"Directly load the compiled graph\(s\) for compile range .* from the cache, took ([\d.]+) s",
    "torch_compile_total": r"torch\.compile took ([\d.]+) s in total",
    "cuda_graphs": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}


class Proc:
    """A child in its own session; every output line goes to ``log`` with a +seconds stamp."""

    def __init__(self, argv: list[str], log: Path, env: dict, cwd: Path | None = None):
        self.argv = argv
        self.t0 = time.monotonic()
        self.log = log
        self.lines: list[tuple[float, str]] = []
        self._f = open(log, "w", buffering=1)
        self._f.write(f"$ {' '.join(argv)}\n")
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for raw in iter(self.p.stdout.readline, b""):
            t = time.monotonic() - self.t0
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append((t, line))
            try:
                self._f.write(f"[+{t:8.2f}s] {line}\n")
            except ValueError:
                break

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, grace_s: float = 30.0) -> dict:
        """SIGINT to the group, then SIGTERM, then SIGKILL; how it ended."""
        t0 = time.monotonic()
        sent = []
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if self.p.poll() is not None:
                break
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            sent.append(sig.name)
            try:
                self.p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive its leader (vLLM's engine core, workers): make sure it is gone
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._pump.join(timeout=5)
        self._f.close()
        return {"signals": sent, "rc": self.p.poll(), "stop_s": round(time.monotonic() - t0, 2)}

    def tail(self, n: int = 30) -> list[str]:
        return [line for _, line in self.lines[-n:]]


def markers(lines: list[tuple[float, str]]) -> dict:
    """The start-up phases found in a process's output: {name: {"s": reported seconds, "at": +s}}."""
    found: dict = {}
    for t, line in lines:
        for name, rx in MARKERS.items():
            m = re.search(rx, line)
            if m:
                found.setdefault(name, []).append({"s": float(m.group(1)), "at": round(t, 2)})
    return found


def http_json(url: str, body: dict | None = None, timeout: float = 5.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def wait_ready(base_url: str | None, proc: Proc, deadline: float, find_url=None) -> dict:
    """Poll until ``/v1/models`` answers, then until one chat completion is answered (max_tokens 1).

    ``find_url`` (a callable returning a base URL or None) is used while ``base_url`` is unknown.
    Times are seconds since ``proc`` started.
    """
    out: dict = {"ready": False}
    while time.monotonic() < deadline:
        if not proc.alive():
            out["error"] = f"exited with {proc.p.returncode} before it was ready"
            return out
        if base_url is None and find_url is not None:
            base_url = find_url()
        if base_url is None:
            time.sleep(0.5)
            continue
        try:
            if "models_s" not in out:
                _, models = http_json(base_url + "/v1/models", timeout=2)
                out["models_s"] = round(time.monotonic() - proc.t0, 2)
                out["model"] = models["data"][0]["id"]
                out["base_url"] = base_url
            body = {"model": out["model"], "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
            status, _ = http_json(base_url + "/v1/chat/completions", body, timeout=60)
            if status == 200:
                out["first_answer_s"] = round(time.monotonic() - proc.t0, 2)
                out["ready"] = True
                return out
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    out["error"] = "not ready before the phase's time limit"
    return out


def compile_cache_state() -> dict:
    """How much vLLM's torch.compile cache holds (warm or cold start?): a phase records it before it starts its
    server (``compile_cache_before``) and once the server is ready (``compile_cache_at_ready``); files added between
    the two mean the server compiled the model, so its time to ready is not a warm one (session AL's first serves)."""
    root = Path(os.environ.get("VLLM_CACHE_ROOT", Path.home() / ".cache" / "vllm")) / "torch_compile_cache"
    n = size = 0
    if root.is_dir():
        for p in root.rglob("*"):
            if p.is_file():
                n += 1
                size += p.stat().st_size
    return {"path": str(root), "files": n, "bytes": size}


def gpu_memory_used_mib() -> list[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return [int(x) for x in out.stdout.split()] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def wait_gpu_free(limit_s: float = 30.0, below_mib: int = 2048) -> list[int] | None:
    end = time.monotonic() + limit_s
    used = gpu_memory_used_mib()
    while used is not None and max(used, default=0) > below_mib and time.monotonic() < end:
        time.sleep(1)
        used = gpu_memory_used_mib()
    return used


def listening_ports() -> set[int]:
    from rftstack.doctor import netstat

    return {ln.port for ln in netstat.listeners()}


def find_openai_servers(ports: set[int], exclude: set[int]) -> list[str]:
    """Base URLs among ``ports`` (on loopback) that answer ``/v1/models``."""
    found = []
    for port in sorted(ports - exclude):
        url = f"http://127.0.0.1:{port}"
        try:
            status, data = http_json(url + "/v1/models", timeout=1.0)
            if status == 200 and isinstance(data, dict) and data.get("data"):
                found.append(url)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            continue  # not HTTP (Ray's and vLLM's gRPC ports answer with HTTP/2 frames: BadStatusLine)
    return found


def trinity_config(path: Path, *, model: Path, label: str, max_model_len: int, gpu_util: float,
                   proxy_port: int, ckpt: Path, db_url: str | None) -> Path:
    """The report's serve config on ``model``, with the proxy on loopback and the bench's settings."""
    from rftstack.run import report_config

    explorer = {"listen_address": "127.0.0.1", "proxy_port": proxy_port, **({"db_url": db_url} if db_url else {})}
    return report_config.write(path, model, max_model_len=max_model_len, checkpoint_root_dir=ckpt, temperature=1.0,
                               project="bench", name=label, gpu_memory_utilization=gpu_util, explorer=explorer)


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.work = self.out / "work" / args.label
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        self.procs: list[Proc] = []
        self.result = {
            "label": args.label,
            "model": str(Path(args.model).resolve()),
            "model_info": self._model_info(),
            "machine": {
                "host": platform.node(), "cpus": os.cpu_count(), "gpu": self._gpu_name(),
                "python": platform.python_version(), "packages": self._versions(),
            },
            "settings": {
                "gpu_memory_utilization": args.gpu_util, "max_model_len": args.max_model_len,
                "concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens,
                "rounds": args.rounds, "spread": args.spread, "spread_levels": args.spread_levels,
                "bare_extra_args": args.bare_extra_args, "ready_only": args.ready_only, "serve_cmd": args.serve_cmd, "db_url": args.db_url,
                "warmup_level": args.warmup_level, "engine_direct_spread": args.engine_direct_spread,
                "env": {k: os.environ.get(k) for k in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_CACHE_ROOT", "CUDA_VISIBLE_DEVICES",
                                                       GROUP_COMMIT_VAR, FAST_FORWARD_VAR, GC_VAR, BUILD_VAR,
                                                       RECORD_VAR)},
            },
            "command": " ".join([sys.executable, *sys.argv]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "phases": {},
        }
        # a later call with the same --label and --out adds its phases to the earlier ones (one
        # model's bare and trinity phases may need two calls of a time-limited machine)
        prev = self.out / f"serve-{args.label}.json"
        if prev.is_file():
            try:
                old = json.loads(prev.read_text())
                self.result["phases"] = {k: v for k, v in old.get("phases", {}).items()}
                self.result["earlier_calls"] = old.get("earlier_calls", []) + [
                    {"command": old.get("command"), "started": old.get("started"), "machine": old.get("machine")}]
            except ValueError:
                pass

    def _model_info(self) -> dict:
        cfg = Path(self.args.model) / "config.json"
        if not cfg.is_file():
            return {}
        c = json.loads(cfg.read_text())
        keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
        return {k: c.get(k) for k in keys}

    @staticmethod
    def _gpu_name() -> str | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            return out.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None

    @staticmethod
    def _versions() -> dict:
        from importlib import metadata

        out = {}
        for d in ("vllm", "torch", "trinity-rft", "ray", "transformers"):
            try:
                out[d] = metadata.version(d)
            except metadata.PackageNotFoundError:
                out[d] = None
        return out

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        path = self.out / f"serve-{self.args.label}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.result, indent=2) + "\n")
        os.replace(tmp, path)

    def say(self, msg: str) -> None:
        print(f"[serve_vs_bare {self.args.label} +{self.args.budget_s - self.remaining():6.1f}s] {msg}", flush=True)

    def env(self) -> dict:
        env = dict(os.environ)
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
        return env

    def proxy_fields(self) -> tuple[str, bool | str]:
        """(its name, loadgen's like_proxy) of the request the proxy sends its engine in this bench's environment."""
        request = engine_direct_request(self.env())
        return request, (loadgen.NUMERIC if request == loadgen.NUMERIC else True)

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> Proc:
        p = Proc(argv, self.logs / f"{self.args.label}-{name}.log", env or self.env(), cwd=self.work)
        self.procs.append(p)
        return p

    def load(self, base_url: str, label: str, *, like_proxy: bool | str, model: str | None = None,
             spread: float = 0.0) -> dict:
        """The load levels (the spread levels when ``spread``), bounded by the budget left (keeps
        ``reserve_s`` for the rest)."""
        levels = loadgen.parse_levels(self.args.spread_levels) if spread else self.levels
        per_level = max(5.0, min(self.args.level_timeout, (self.remaining() - self.args.reserve_s) / len(levels)))
        return asyncio.run(loadgen.run(
            base_url, levels=levels, requests=0, requests_for=self.requests_for, max_tokens=self.args.max_tokens,
            model=model, label=label, like_proxy=like_proxy, warmup=4, level_timeout_s=per_level,
            request_timeout_s=min(120.0, per_level), progress=self.say, spread=spread, gpu=True,
        ))

    def warm_up(self, r: dict, base_url: str, label: str, model: str | None) -> None:
        """``--warmup-level C:N``: N requests at concurrency C before the measured levels, kept in
        ``r["warmup_level"]`` apart from them (no ratio reads it): whether the first measured level pays for
        what is still cold. Without the option, nothing."""
        c, n = parse_warmup_level(self.args.warmup_level)
        if not c:
            return
        r["warmup_level"] = asyncio.run(loadgen.run(
            base_url, levels=[c], requests=n, max_tokens=self.args.max_tokens, model=model, label=f"{label}-warmup",
            warmup=4, level_timeout_s=self.args.level_timeout, request_timeout_s=min(120.0, self.args.level_timeout),
            progress=self.say,
        ))

    @property
    def levels(self) -> list[int]:
        return loadgen.parse_levels(self.args.concurrency)

    def requests_for(self, c: int) -> int:
        return self.args.requests if self.args.requests > 0 else max(16, self.args.rounds * c)

    # -- phases ---------------------------------------------------------------------------------

    def phase_bare(self) -> dict:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = ["vllm", "serve", str(self.args.model), "--host", "127.0.0.1", "--port", str(port),
                "--gpu-memory-utilization", str(self.args.gpu_util), "--max-model-len", str(self.args.max_model_len),
                *self.args.bare_extra_args.split()]
        r: dict = {"argv": argv, "compile_cache_before": compile_cache_state()}
        p = self.spawn("bare", argv)
        r["ready"] = wait_ready(base, p, time.monotonic() + min(self.args.ready_timeout, self.remaining() - 30))
        r["compile_cache_at_ready"] = compile_cache_state()
        r["startup_markers"] = markers(p.lines)
        if r["ready"]["ready"] and not self.args.ready_only:
            self.warm_up(r, base, "bare", r["ready"]["model"])
            r["load"] = self.load(base, "bare", like_proxy=False, model=r["ready"]["model"])
            if not self.args.no_like_proxy:  # bare sent what the proxy sends its engine (the installed vLLM's patch)
                r["like_proxy_request"], fields = self.proxy_fields()
                r["load_like_proxy"] = self.load(base, "bare-like-proxy", like_proxy=fields, model=r["ready"]["model"])
            if self.args.spread:
                r["load_spread"] = self.load(base, "bare-spread", like_proxy=False, model=r["ready"]["model"],
                                             spread=self.args.spread)
        else:
            r["log_tail"] = p.tail()
        r["stop"] = p.stop()
        r["gpu_memory_after_mib"] = wait_gpu_free()
        return r

    def _trinity_like(self, name: str, argv_for, *, env: dict | None = None, extra_ready=None) -> dict:
        """Shared by the trinity and manual phases: start (with ``env``, default :meth:`env`), wait for
        the proxy, optionally load."""
        proxy_port = free_port()
        cfg = trinity_config(self.work / f"{name}.yaml", model=Path(self.args.model).resolve(), label=f"{self.args.label}-{name}",
                             max_model_len=self.args.max_model_len, gpu_util=self.args.gpu_util, proxy_port=proxy_port,
                             ckpt=self.work / f"{name}-ckpt", db_url=self.args.db_url)
        run_dir = self.work / f"{name}-run"
        shutil.rmtree(run_dir, ignore_errors=True)
        r: dict = {"config": str(cfg), "compile_cache_before": compile_cache_state()}
        before = listening_ports()
        argv = argv_for(cfg, run_dir)
        r["argv"] = argv
        p = self.spawn(name, argv, env)

        def find_url() -> str | None:
            # the runner may move the proxy to another free port: read its status/config if so
            st = run_dir / "status.json"
            if st.is_file():
                try:
                    s = json.loads(st.read_text())
                    for k in ("endpoint", "proxy_url", "base_url"):
                        if isinstance(s.get(k), str) and s[k].startswith("http"):
                            return s[k].rstrip("/").removesuffix("/v1")
                except ValueError:
                    pass
            eff = run_dir / "config.yaml"
            if eff.is_file():
                m = re.search(r"^\s*proxy_port:\s*(\d+)", eff.read_text(), re.M)
                if m:
                    return f"http://127.0.0.1:{m.group(1)}"
            return f"http://127.0.0.1:{proxy_port}"

        r["ready"] = wait_ready(None, p, time.monotonic() + min(self.args.ready_timeout, self.remaining() - 45), find_url)
        r["compile_cache_at_ready"] = compile_cache_state()
        r["startup_markers"] = markers(p.lines)
        if extra_ready:
            r.update(extra_ready)
        if r["ready"]["ready"] and name in LOADED and not self.args.ready_only:
            base = r["ready"]["base_url"]
            self.warm_up(r, base, f"{name}-proxy", r["ready"]["model"])
            r["load"] = self.load(base, f"{name}-proxy", like_proxy=False, model=r["ready"]["model"])
            if self.args.spread:
                r["load_spread"] = self.load(base, f"{name}-proxy-spread", like_proxy=False, model=r["ready"]["model"],
                                             spread=self.args.spread)
            proxy = int(base.rsplit(":", 1)[1])
            try:  # the proxy's figures above are kept whatever happens here
                engines = find_openai_servers(listening_ports() - before, exclude={proxy})
                r["engine_urls"] = engines
                request, fields = self.proxy_fields()
                if engines and name == "trinity" and (not self.args.no_like_proxy or self.args.engine_direct_spread):
                    r["engine_direct_request"] = request
                if engines and name == "trinity" and not self.args.no_like_proxy:
                    r["load_engine_direct"] = self.load(engines[0], "trinity-engine-direct", like_proxy=fields,
                                                        model=r["ready"]["model"])
                if engines and name == "trinity" and self.args.spread and self.args.engine_direct_spread:
                    # the proxy's request sent straight to its engine, spread lengths: in the engine or in the proxy?
                    r["load_engine_direct_spread"] = self.load(engines[0], "trinity-engine-direct-spread", like_proxy=fields,
                                                               model=r["ready"]["model"], spread=self.args.spread)
            except Exception as exc:
                r["engine_direct_error"] = f"{type(exc).__name__}: {exc}"[:300]
            try:
                r["proxy_metrics"] = http_json(base + "/metrics", timeout=5)[1]
            except (urllib.error.URLError, OSError, ValueError):
                pass
        elif not r["ready"]["ready"]:
            r["log_tail"] = p.tail(60)
        r["stop"] = p.stop(grace_s=30.0)
        return r

    def phase_trinity(self, name: str = "trinity", env: dict | None = None) -> dict:
        def argv_for(cfg: Path, run_dir: Path) -> list[str]:
            return self.args.serve_cmd.format(python=sys.executable, config=cfg, run_dir=run_dir).split()

        r = self._trinity_like(name, argv_for, env=env)
        r["ray_stop"] = ray_stop_force()
        r["gpu_memory_after_mib"] = wait_gpu_free()
        return r

    def phase_switched(self, name: str) -> dict:
        """``trinity`` with SWITCHED[name]'s variables set, side by side with it in one run."""
        switched = dict(SWITCHED[name])
        r = self.phase_trinity(name, env={**self.env(), **switched})
        r["env"] = switched
        return r

    def phase_manual(self) -> dict:
        ray_dir = Path(f"/tmp/rb-{os.getpid()}")  # Ray's socket paths must stay short
        gcs = free_port()
        env = self.env()
        env["RAY_ADDRESS"] = f"127.0.0.1:{gcs}"
        t0 = time.monotonic()
        head = subprocess.run(
            ["ray", "start", "--head", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
             f"--port={gcs}", "--num-gpus=1", "--disable-usage-stats", f"--temp-dir={ray_dir}",
             "--include-dashboard=false"],
            env=env, capture_output=True, text=True, timeout=min(120, self.remaining() - 30),
        )
        ray_s = round(time.monotonic() - t0, 2)
        (self.logs / f"{self.args.label}-manual-ray-start.log").write_text(head.stdout + head.stderr)
        if head.returncode != 0:
            return {"ray_start_s": ray_s, "error": f"ray start exited {head.returncode}", "ray_stop": ray_stop_force()}

        def argv_for(cfg: Path, run_dir: Path) -> list[str]:
            return ["trinity", "run", "--config", str(cfg)]

        r = self._trinity_like("manual", argv_for, env=env)  # trinity run must find this head
        r["ray_start_s"] = ray_s
        if r["ready"].get("ready"):
            r["ready"]["first_answer_incl_ray_start_s"] = round(r["ready"]["first_answer_s"] + ray_s, 2)
        r["ray_stop"] = ray_stop_force()
        shutil.rmtree(ray_dir, ignore_errors=True)
        r["gpu_memory_after_mib"] = wait_gpu_free()
        return r

    def run(self) -> int:
        phases = [p.strip() for p in self.args.phases.split(",") if p.strip()]
        estimate = {"bare": 180, "trinity": 300, **{n: 240 for n in SWITCHED}, "manual": 240}
        if self.args.ready_only:
            estimate = {"bare": 120, **{n: 200 for n in ("trinity", *SWITCHED, "manual")}}
        for ph in phases:
            if self.remaining() < estimate[ph] * 0.5:
                self.result["phases"][ph] = {"skipped": f"budget: {self.remaining():.0f} s left"}
                self.say(f"{ph}: skipped, {self.remaining():.0f} s left")
                continue
            self.say(f"{ph}: start")
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            try:
                self.result["phases"][ph] = (self.phase_switched(ph) if ph in SWITCHED
                                             else getattr(self, f"phase_{ph.replace('-', '_')}")())
                self.result["phases"][ph].update(started=started, host=platform.node())
            except Exception as exc:  # record, clean up, go on with the next phase
                self.result["phases"][ph] = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                for p in self.procs:
                    if p.alive():
                        p.stop(grace_s=10)
                self.procs.clear()
            self.say(done_line(ph, self.result["phases"][ph]))
            self.save()
        self.result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.result["summary"] = summary(self.result)
        self.save()
        print(json.dumps(self.result["summary"], indent=2))
        return 0


RAY_STOP = True  # --no-ray-stop clears it (a shared machine: never `ray stop --force` there)


def ray_stop_force() -> dict:
    if not RAY_STOP:
        return {"skipped": "--no-ray-stop"}
    t0 = time.monotonic()
    try:
        r = subprocess.run(["ray", "stop", "--force"], capture_output=True, text=True, timeout=60)
        return {"rc": r.returncode, "s": round(time.monotonic() - t0, 2)}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}


def _level(load: dict | None, c: int) -> dict | None:
    for lv in (load or {}).get("levels", []):
        if lv["concurrency"] == c:
            return lv
    return None


def done_line(name: str, phase: dict) -> str:
    """The line printed when phase ``name`` ended: ready or not, its first answer, and whether it compiled the model."""
    ready, compiled = phase.get("ready", {}), compiled_before_ready(phase)
    return (f"{name}: done; ready={ready.get('ready')} first answer {ready.get('first_answer_s')} s"
            + (f"; compiled the model ({compiled} new files in vLLM's compile cache): not a warm start" if compiled else ""))


def compiled_before_ready(phase: dict) -> int | None:
    """The files vLLM's compile cache gained while ``phase``'s server started (0: a warm start; None: the phase
    predates the measurement or never became ready)."""
    before, at_ready = phase.get("compile_cache_before"), phase.get("compile_cache_at_ready")
    if not before or not at_ready or not (phase.get("ready") or {}).get("ready"):
        return None
    return max(0, at_ready["files"] - before["files"])


def summary(result: dict) -> dict:
    """Ratios the issue asks for: proxy/bare throughput per level (whole-wall and, where loadgen
    measured it, steady-state: :func:`_ratios`), time-to-ready ratios."""
    ph = result["phases"]
    bare, tri, man = ph.get("bare", {}), ph.get("trinity", {}), ph.get("manual", {})
    out: dict = {"label": result["label"], "ready_s": {}, "throughput_ratio": {}}
    for name, p in (("bare", bare), ("trinity", tri), *((n, ph.get(n, {})) for n in SWITCHED), ("manual", man)):
        r = p.get("ready", {})
        if r.get("ready"):
            out["ready_s"][name] = r.get("first_answer_incl_ray_start_s", r["first_answer_s"])
    compiled = {name: n for name, p in ph.items() if (n := compiled_before_ready(p))}
    if compiled:  # their times to ready include compiling the model: not warm ones
        out["compiled_before_ready"] = compiled
    if "bare" in out["ready_s"]:
        for name in ("trinity", *SWITCHED, "manual"):
            if name in out["ready_s"]:
                out[f"ready_ratio_{name.replace('-', '_')}_vs_bare"] = round(out["ready_s"][name] / out["ready_s"]["bare"], 3)
    switched = [(f"proxy_{n.removeprefix('trinity-').replace('-', '_')}", ph.get(n, {})) for n in SWITCHED if n in LOADED]
    out["throughput_ratio"] = _ratios(bare.get("load"), (
        ("bare_like_proxy", bare.get("load_like_proxy")), ("engine_direct", tri.get("load_engine_direct")),
        ("proxy", tri.get("load")), *((key, p.get("load")) for key, p in switched)))
    if bare.get("load_spread"):
        out["throughput_ratio_spread"] = _ratios(bare.get("load_spread"), (
            ("engine_direct", tri.get("load_engine_direct_spread")), ("proxy", tri.get("load_spread")), *((key, p.get("load_spread")) for key, p in switched)))
    return out


def _steady_tok_s(lv: dict) -> float | None:
    """A level's steady-state output tokens/s (loadgen's ``steady``), None when it has none."""
    return (lv.get("steady") or {}).get("output_tokens_per_s")


def _ratios(bare_load: dict | None, others) -> dict:
    """{c: {bare_tok_s, <key>_tok_s, <key>_vs_bare, ...}} for each level of the bare load.

    Where either level carries loadgen's ``steady`` (rates without ramp-up and drain) the row also
    has ``bare_steady_tok_s`` (when the bare level carries it), ``<key>_steady_tok_s`` and
    ``<key>_steady_vs_bare``, None when either side has no steady figure; results measured before
    loadgen had ``steady`` get rows as before."""
    table = {}
    for lv in (bare_load or {}).get("levels", []):
        c = lv["concurrency"]
        row = {"bare_tok_s": lv["output_tokens_per_s"]}
        bare_steady = _steady_tok_s(lv)
        if "steady" in lv:
            row["bare_steady_tok_s"] = bare_steady
        for key, load in others:
            other = _level(load, c)
            if other:
                row[f"{key}_tok_s"] = other["output_tokens_per_s"]
                if lv["output_tokens_per_s"]:
                    row[f"{key}_vs_bare"] = round(other["output_tokens_per_s"] / lv["output_tokens_per_s"], 3)
                if "steady" in lv or "steady" in other:
                    other_steady = _steady_tok_s(other)
                    row[f"{key}_steady_tok_s"] = other_steady
                    row[f"{key}_steady_vs_bare"] = (round(other_steady / bare_steady, 3)
                                                    if bare_steady and other_steady is not None else None)
        table[str(c)] = row
    return table


def parse_warmup_level(text: str) -> tuple[int, int]:
    """``C:N`` (both positive) as (C, N); empty: (0, 0), no warm-up level."""
    if not text.strip():
        return 0, 0
    c, sep, n = text.strip().partition(":")
    if not (sep and c.isdigit() and n.isdigit() and int(c) > 0 and int(n) > 0):
        raise ValueError(f"--warmup-level {text!r} must be CONCURRENCY:REQUESTS, two positive numbers (e.g. 32:512)")
    return int(c), int(n)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (bench/model_3b.py or rftstack tiny-model)")
    ap.add_argument("--label", required=True, help="name of this run (file names), e.g. tiny or qwen3b")
    ap.add_argument("--out", required=True, help="results directory")
    ap.add_argument("--phases", default="bare,trinity", help=f"comma list of {', '.join(PHASES)} (default bare,trinity)")
    ap.add_argument("--budget-s", type=float, default=540, help="the whole run ends within this (default 540)")
    ap.add_argument("--reserve-s", type=float, default=60, help="budget kept back for stopping and later phases")
    ap.add_argument("--ready-timeout", type=float, default=300, help="limit for one start-up, seconds")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default 0: max(16, ROUNDS x concurrency))")
    ap.add_argument("--rounds", type=int, default=4, help="requests per client and level when --requests is 0 (default 4)")
    ap.add_argument("--spread", type=float, default=0.0, metavar="S",
                    help="also run --spread-levels with output lengths spread over [M(1-S), M(1+S)] (default 0: not run)")
    ap.add_argument("--spread-levels", default="32", help="concurrency levels of the spread load (default 32)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--level-timeout", type=float, default=30, help="no new request after this per level")
    ap.add_argument("--gpu-util", type=float, default=0.6, help="--gpu-memory-utilization for both paths (the report's 0.60)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--bare-extra-args", default="", help="more `vllm serve` arguments, e.g. '--seed 42'")
    ap.add_argument("--serve-cmd", default="{python} -m rftstack serve -c {config} --run-dir {run_dir}",
                    help="how to start the runner ({python}, {config}, {run_dir} are filled in)")
    ap.add_argument("--db-url", default=None, help="explorer.db_url for the proxy's recorder (default: Trinity's sqlite file)")
    ap.add_argument("--warmup-level", default="", metavar="C:N",
                    help="N unmeasured requests at concurrency C before each phase's measured levels (e.g. 32:512)")
    ap.add_argument("--engine-direct-spread", action="store_true",
                    help="with --spread: also send the proxy's request (logprobs, token ids; numeric logprobs unless "
                         "RFTSTACK_PROXY_NUMERIC_LOGPROBS=0) straight to trinity's engine "
                         "at the spread levels, after the proxy's loads (where a loss with spread lengths lies)")
    ap.add_argument("--no-like-proxy", action="store_true", help="skip the like-proxy / engine-direct load runs")
    ap.add_argument("--ready-only", action="store_true", help="time to ready only, no load (e.g. a warm-cache rerun)")
    ap.add_argument("--no-ray-stop", action="store_true",
                    help="do not run `ray stop --force` after the Trinity phases (it stops every Ray on the machine)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    bad = [p for p in args.phases.split(",") if p.strip() and p.strip() not in PHASES]
    if bad:
        print(f"serve_vs_bare: unknown phase {bad[0]!r}; choose from {', '.join(PHASES)}", file=sys.stderr)
        return 2
    if not (Path(args.model) / "config.json").is_file():
        print(f"serve_vs_bare: {args.model} has no config.json; make one with bench/model_3b.py or `rftstack tiny-model`",
              file=sys.stderr)
        return 2
    loadgen.parse_levels(args.concurrency)
    loadgen.parse_levels(args.spread_levels)
    if not 0 <= args.spread < 1 or args.rounds < 1:
        print(f"serve_vs_bare: --spread {args.spread} must be at least 0 and below 1 (e.g. 0.75), and --rounds "
              f"{args.rounds} at least 1", file=sys.stderr)
        return 2
    if args.engine_direct_spread and not args.spread:
        print("serve_vs_bare: --engine-direct-spread loads the spread levels; give --spread too (e.g. --spread 0.75)",
              file=sys.stderr)
        return 2
    try:
        parse_warmup_level(args.warmup_level)
    except ValueError as exc:
        print(f"serve_vs_bare: {exc}", file=sys.stderr)
        return 2
    global RAY_STOP
    RAY_STOP = not args.no_ray_stop
    bench = Bench(args)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return bench.run()
    except KeyboardInterrupt:
        bench.result["interrupted"] = True
        bench.save()
        return 130
    finally:
        for p in bench.procs:
            if p.alive():
                p.stop(grace_s=5)
        if any(ph in args.phases for ph in ("trinity", "manual")):
            ray_stop_force()


if __name__ == "__main__":
    sys.exit(main())
