"""TEST DOUBLE for `trinity run --config X` in serve mode (the real one needs a GPU).

Reads the effective config like trinity does (explorer.listen_address, explorer.proxy_port),
serves /health and /v1/models on it, and behaves as FAKE_TRINITY (comma-separated) says:

  crash_after_ready     exit 3 two seconds after the proxy is up
  exit_at_start         exit 4 at once, before serving
  never_ready           serve /health with 503 forever
  ignore_sigint         ignore SIGINT (serve must escalate to SIGTERM)
  ignore_sigterm        ignore SIGINT and SIGTERM (serve must escalate to SIGKILL)
  grandchildren         start two `sleep` grandchildren, one in its own session (an escapee)
  check_ray             connect to the Ray head from the config (cluster.ray_address) first
  engine_child          as Trinity does, create a Ray actor whose child process is titled
                        `VLLM::EngineCore` (setproctitle, as vLLM titles its engine); its pid goes
                        to $FAKE_TRINITY_PIDS as "engine"
  engine_gpu            engine_child, with the actor asking Ray for one GPU as a vLLM engine
                        does (a resource count: a CPU node advertising --num-gpus 1 takes it);
                        the address of the node it ran on goes to $FAKE_TRINITY_PIDS as "engine_node"
  explorer_actor        as Trinity does, serve the proxy from a Ray actor made by Trinity's own
                        `Explorer.get_actor` (the installed, patched code: its placement follows
                        RFTSTACK_EXPLORER_NODE) for a double of the Explorer class (the real one
                        loads vLLM engines); the address of the node it ran on goes to
                        $FAKE_TRINITY_PIDS as "explorer_node"

It writes its pid and its grandchildren's pids to $FAKE_TRINITY_PIDS (a file) when set.

With `mode: train` (rftstack train) it stands in for Trinity's verl trainer instead: each "step"
logs `Training at step N started.`, then `Training at step N finished.` and writes a checkpoint
the way the trainer does (`<job dir>/global_step_N/actor/`, `.full_checkpoint`, then
`latest_checkpointed_iteration.txt` and `latest_state_dict_iteration.txt`), $FAKE_TRAIN_STEPS
steps (default 2) half a second apart, then `Trainer finished.` and exit 0.
FAKE_TRINITY modes for train: `train_error` (step 2 logs `Error in Trainer:` and a traceback after
it started, then saves the final checkpoint with the failed step's number two seconds later, as
Trinity's trainer does after the error with verl's step counter, and exits 0), `train_forever` (steps until SIGINT),
`train_no_more` (after its steps, logs Trinity's `No more samples to train. Stopping training.`,
what the SQL reader's max_read_timeout ends in), `train_reads` (before each step, Trinity's real
sample strategy reads the step's batch from the config's SQL store, as `Trainer._sample_data`
does; the storage runs in this process instead of a Ray actor), `ignore_sigint`, `exit_at_start`
as above. Only the verl step and its checkpoint are doubles.
"""

import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import yaml


ENGINE = None  # the actor handle: the actor (and its titled child) lives as long as the double
EXPLORER = None  # the same for the explorer double


def connect(ray_address: str) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_address, log_to_driver=False)


def start_engine_child(ray_address: str, num_gpus: int = 0) -> tuple[int, str]:
    global ENGINE
    import ray

    connect(ray_address)

    @ray.remote(num_cpus=0, num_gpus=num_gpus)
    class Engine:
        def start(self) -> int:
            title = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(600)"
            self.proc = subprocess.Popen([sys.executable, "-c", title])
            for _ in range(200):  # vLLM titles its engine long before it is ready; so does the double
                if open(f"/proc/{self.proc.pid}/cmdline", "rb").read().startswith(b"VLLM::"):
                    break
                time.sleep(0.05)
            return self.proc.pid

        def node(self) -> str:
            return ray.util.get_node_ip_address()

    ENGINE = Engine.remote()
    return ray.get(ENGINE.start.remote()), ray.get(ENGINE.node.remote())


def make_server(host: str, port: int, model: str, ready: bool) -> http.server.ThreadingHTTPServer:
    """The proxy double: /health and /v1/models on host:port, served from a thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                code, body = (200, {"status": "ok"}) if ready else (503, {"status": "loading"})
            elif self.path == "/v1/models" and ready:
                code, body = 200, {"object": "list", "data": [{"id": model, "object": "model"}]}
            else:
                code, body = 404, {"error": "not found"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class ExplorerDouble:
    """TEST DOUBLE for trinity.explorer.explorer.Explorer (its real __init__ creates vLLM engines):
    the actor serves the proxy double where Ray placed it, as the real Explorer serves its proxy."""

    def __init__(self, config):
        self.settings = config.double

    def serve(self) -> str:
        import ray

        s = self.settings
        self.server = make_server(s["host"], s["port"], s["model"], s["ready"])
        return ray.util.get_node_ip_address()


def start_explorer(ray_address: str, settings: dict) -> str:
    """Trinity's own Explorer.get_actor (as installed, with its patches) creates the actor; the
    class it is given is the double. The address of the node the actor runs on."""
    global EXPLORER
    import types

    import ray
    from trinity.explorer.explorer import Explorer

    connect(ray_address)
    config = types.SimpleNamespace(explorer=types.SimpleNamespace(name="explorer"), ray_namespace="rftstack-double", double=settings)
    EXPLORER = Explorer.get_actor.__func__(ExplorerDouble, config)
    return ray.get(EXPLORER.serve.remote(), timeout=120)


def trinity_sampler(config_path: str):
    """Trinity's real sample strategy for the train config, built as trinity/trainer/trainer.py
    builds it; its SQL storage in this process (wrap_in_ray false) instead of a Ray actor."""
    from trinity.algorithm import SAMPLE_STRATEGY
    from trinity.common.config import load_config

    config = load_config(config_path)
    config.check_and_update()
    strategy = SAMPLE_STRATEGY.get(config.algorithm.sample_strategy)(
        buffer_config=config.buffer, **(config.algorithm.sample_strategy_args or {}))
    strategy.exp_buffer.wrap_in_ray = False
    return strategy


def save_checkpoint(job: str, step: int) -> None:
    """The checkpoint of ``step`` as verl's trainer and Trinity's CheckpointMonitor leave it."""
    os.makedirs(os.path.join(job, f"global_step_{step}", "actor"), exist_ok=True)
    open(os.path.join(job, f"global_step_{step}", ".full_checkpoint"), "w").close()
    for name in ("latest_checkpointed_iteration.txt", "latest_state_dict_iteration.txt"):
        with open(os.path.join(job, name), "w") as f:
            f.write(str(step))


def train_main(cfg: dict, modes: set, config_path: str) -> int:
    job = os.path.join(cfg["checkpoint_root_dir"], cfg.get("project") or "Trinity-RFT", cfg.get("group") or "", cfg.get("name") or "rft")
    print(f"fake trinity: mode=train job={job} modes={sorted(modes)}", flush=True)
    if "ignore_sigint" in modes:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("FAKE_TRINITY_PIDS"):
        with open(os.environ["FAKE_TRINITY_PIDS"], "w") as f:
            json.dump({"trinity": os.getpid(), "grandchildren": []}, f)
    if "exit_at_start" in modes:
        print("fake trinity: Traceback (most recent call last): simulated start-up failure", flush=True)
        return 4
    steps = int(os.environ.get("FAKE_TRAIN_STEPS", "2"))
    step = 0
    sampler, loop = (trinity_sampler(config_path), asyncio.new_event_loop()) if "train_reads" in modes else (None, None)
    try:
        while "train_forever" in modes or step < steps:
            if sampler is not None:  # Trainer._sample_data: Trinity's reader, for the next step
                exps, _, _ = loop.run_until_complete(sampler.sample(step + 1))
                print(f"fake trinity: Sample data for step {step + 1} finished ({len(exps)} experiences).", flush=True)
            step += 1
            print(f"fake trinity: Training at step {step} started.", flush=True)
            time.sleep(0.5)
            if "train_error" in modes and step == 2:
                print("fake trinity: Error in Trainer:\nTraceback (most recent call last):\nRuntimeError: simulated step failure", flush=True)
                time.sleep(2)  # Trainer.train's final save, numbered with verl's counter; it takes a while
                save_checkpoint(job, step)
                break
            save_checkpoint(job, step)
            print(f"fake trinity: Training at step {step} finished.", flush=True)
    except KeyboardInterrupt:
        print("fake trinity: SIGINT, shutting down", flush=True)
        return 0
    if "train_no_more" in modes:
        print("fake trinity: No more samples to train. Stopping training.", flush=True)
    print("fake trinity: > Trainer finished.", flush=True)
    return 0


def main() -> int:
    assert sys.argv[1:3] == ["run", "--config"], sys.argv
    cfg = yaml.safe_load(open(sys.argv[3]))
    modes = set(filter(None, os.environ.get("FAKE_TRINITY", "").split(",")))
    if cfg.get("mode") == "train":
        return train_main(cfg, modes, sys.argv[3])
    host = cfg["explorer"]["listen_address"]
    port = int(cfg["explorer"]["proxy_port"])
    print(f"fake trinity: mode={cfg['mode']} listen={host}:{port} modes={sorted(modes)}", flush=True)

    if "ignore_sigint" in modes or "ignore_sigterm" in modes:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "ignore_sigterm" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = {"trinity": os.getpid(), "grandchildren": []}
    if "grandchildren" in modes:
        a = subprocess.Popen(["sleep", "600"])
        b = subprocess.Popen(["sleep", "600"], start_new_session=True)
        pids["grandchildren"] = [a.pid, b.pid]
    if "engine_child" in modes or "engine_gpu" in modes:
        pids["engine"], pids["engine_node"] = start_engine_child(cfg["cluster"]["ray_address"], 1 if "engine_gpu" in modes else 0)
    ready = "never_ready" not in modes
    model = cfg["model"]["model_path"]
    if "explorer_actor" in modes:
        pids["explorer_node"] = start_explorer(cfg["cluster"]["ray_address"], {"host": host, "port": port, "model": model, "ready": ready})
    if os.environ.get("FAKE_TRINITY_PIDS"):
        with open(os.environ["FAKE_TRINITY_PIDS"], "w") as f:
            json.dump(pids, f)
    if "check_ray" in modes:
        import ray

        ray.init(address=cfg["cluster"]["ray_address"], log_to_driver=False)
        print(f"fake trinity: connected to Ray, resources {ray.cluster_resources()}", flush=True)
        ray.shutdown()
    if "exit_at_start" in modes:
        print("fake trinity: Traceback (most recent call last): simulated start-up failure", flush=True)
        return 4

    server = None if "explorer_actor" in modes else make_server(host, port, model, ready)
    print("fake trinity: loading model ... done; proxy up", flush=True)
    if "crash_after_ready" in modes:
        time.sleep(2)
        print("fake trinity: RuntimeError: simulated engine crash", flush=True)
        os._exit(3)
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("fake trinity: SIGINT, shutting down", flush=True)
        if server is not None:
            server.shutdown()
        return 0


if __name__ == "__main__":
    sys.exit(main())
