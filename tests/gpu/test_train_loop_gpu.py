"""The RL loop closed on one GPU: `rftstack serve` (the report's config on the tiny model, its
vLLM share lowered to 0.3 so the trainer fits beside it) collects episodes from an agent, `rftstack
train` (Trinity's train mode, verl FSDP, its own Ray head) trains on them, and the serve loads each
checkpoint without a restart while a client keeps sending requests.

Order (one module fixture, tests in file order): batch 1 (8 episodes, rewards, /commit) -> train
starts -> step 1 -> serve at model_version 1, greedy output changed -> batch 2 from version 1 ->
step 2 -> model_version 2 -> train exits 0 -> serve stopped by SIGINT -> GPU memory back.
Times of one training step (verl's time/train_step) and of the reloads go to
$RFTSTACK_GPU_RESULTS/train_loop.json.

Run on the GPU host:  python3 -m pytest -v -s tests/gpu/test_train_loop_gpu.py
Other models and LoRA (the same test, for the memory figures of docs/train.md):
RFTSTACK_TRAIN_MODEL=DIR (default: the tiny model) and RFTSTACK_TRAIN_LORA_RANK=N (default 0: full
fine-tune; N > 0 writes `model.lora_configs` into both configs, as `rftstack example-config
--lora-rank N` does); the results file is then train_loop-<name>.json.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from helpers import ServeRun, rftstack_env
from gpu_helpers import gpu_memory_used_mib, has_gpu, memory_back_after, post

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

if not has_gpu():
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

RESULTS = Path(os.environ.get("RFTSTACK_GPU_RESULTS", tempfile.gettempdir()))
BATCH = 8
MODEL = os.environ.get("RFTSTACK_TRAIN_MODEL", "")
LORA_RANK = int(os.environ.get("RFTSTACK_TRAIN_LORA_RANK", "0"))
RUN_NAME = "-".join(x for x in (Path(MODEL).name if MODEL else "", f"lora{LORA_RANK}" if LORA_RANK else "") if x)
PROBE = "hello world"
LR = 5e-3  # the tiny random model: one step must change its greedy output visibly


class Client(threading.Thread):
    """An agent that keeps sending requests through the reloads; every failure is kept."""

    def __init__(self, endpoint: str, model: str):
        super().__init__(daemon=True)
        from openai import OpenAI

        self.client = OpenAI(base_url=endpoint, api_key="unused", max_retries=0, timeout=300)
        self.model = model
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": f"keep going {i}"}], max_tokens=8)
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                self.failures.append(f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(0.05)


class MemorySampler(threading.Thread):
    """The GPU's used memory (nvidia-smi, all processes) twice a second: the peak while training,
    minus what the serve held before the trainer started, is the trainer's peak."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak_mib = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak_mib = max(self.peak_mib, gpu_memory_used_mib())
            except Exception:  # noqa: BLE001 - a missed sample is not a finding
                pass
            time.sleep(0.5)


class Loop:
    def __init__(self, tmp: Path, serve: ServeRun, ready: dict, baseline_mib: int, train_cfg: Path):
        from openai import OpenAI

        self.tmp, self.serve, self.ready, self.baseline_mib, self.train_cfg = tmp, serve, ready, baseline_mib, train_cfg
        self.endpoint = ready["endpoint"]
        self.base = self.endpoint[: -len("/v1")]
        self.client = OpenAI(base_url=self.endpoint, api_key="unused", max_retries=0, timeout=300)
        self.model = self.client.models.list().data[0].id
        self.config = yaml.safe_load((serve.run_dir / "config.yaml").read_text())
        self.train: ServeRun | None = None
        self.greedy: dict[int, str] = {}
        self.versions_seen: list[int] = []
        self.reload_lag_s: dict[int, float] = {}
        self.committed: list[str] = []
        self.numpy_in_trainer: set[str] = set()
        self.results: dict = {}

    def metrics(self) -> dict:
        return json.loads(urllib.request.urlopen(self.base + "/metrics", timeout=30).read())

    def version(self) -> int | None:
        return self.metrics().get("rollout/model_0/model_version")

    def probe(self) -> str:
        r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": PROBE}], max_tokens=16)
        return r.choices[0].message.content or ""

    def episodes(self, batch: int) -> None:
        """BATCH episodes with rewards that differ (REINFORCE++ whitens them), then /commit."""
        ids = []
        for i in range(BATCH):
            r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": f"task {batch}-{i}: say a word"}],
                                                    max_tokens=12, temperature=1.0)  # fmt: skip
            reward = float(len(r.choices[0].message.content or "") % 5) / 4 + 0.1 * i
            got = post(self.base + "/feedback", {"reward": reward, "msg_ids": [r.id], "task_id": f"t{batch}-{i}", "run_id": 0})
            assert got["status"] == "success", got
            ids.append(r.id)
        assert post(self.base + "/commit", {})["status"] == "success"
        self.committed += ids

    def wait_version(self, v: int, since: float, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            cur = self.version()
            if cur is not None and (not self.versions_seen or self.versions_seen[-1] != cur):
                self.versions_seen.append(cur)
            if cur == v:
                self.reload_lag_s[v] = round(time.monotonic() - since, 2)
                return
            time.sleep(0.25)
        raise AssertionError(f"the serve did not reach model_version {v} within {timeout} s (seen {self.versions_seen})")

    def sample_numpy(self) -> None:
        """numpy as loaded by the train run's processes (/proc/PID/maps -> the dist-info beside it)."""
        from rftstack.run import supervisor

        for tag in self.train.tags():
            for p in supervisor.tagged(tag):
                try:
                    maps = Path(f"/proc/{p.pid}/maps").read_text()
                except OSError:
                    continue
                for m in re.finditer(r"(\S+)/numpy/_core/_multiarray_umath\S*\.so", maps):
                    for info in Path(m.group(1)).glob("numpy-*.dist-info"):
                        self.numpy_in_trainer.add(info.name[6:-10])


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from rftstack.run import report_config, supervisor, tinymodel, train_config

    tmp = tmp_path_factory.mktemp("train-loop")
    model = Path(MODEL) if MODEL else tinymodel.ensure(tmp / "tiny")
    ckpt = tmp / "ckpt"
    serve_cfg = report_config.write(tmp / "serve.yaml", model, max_model_len=2048, temperature=0.0, checkpoint_root_dir=ckpt,
                                    gpu_memory_utilization=0.3, algorithm=train_config.ALGORITHM)  # fmt: skip
    tc = train_config.example(model, checkpoint_root_dir=str(ckpt), project=report_config.REPORT_PROJECT, name=report_config.REPORT_NAME,
                              max_model_len=2048, train_batch_size=BATCH, total_steps=2, lora_rank=LORA_RANK or None)  # fmt: skip
    tc["algorithm"]["optimizer"] = {"lr": LR}
    if LORA_RANK:  # the serve loads the adapter the trainer writes (vLLM's runtime LoRA), as example-config --lora-rank writes it
        sc = yaml.safe_load(serve_cfg.read_text())
        sc["model"]["lora_configs"] = tc["model"]["lora_configs"]
        serve_cfg.write_text(yaml.safe_dump(sc, sort_keys=False))
    train_cfg = tmp / "train.yaml"
    train_cfg.write_text(yaml.safe_dump(tc, sort_keys=False))
    baseline = gpu_memory_used_mib()
    env = rftstack_env(XDG_CACHE_HOME=str(tmp / "cache"))
    serve = ServeRun(["-c", str(serve_cfg), "--num-gpus", "1"], env, tmp, tmp / "serve-run")
    lp = None
    try:
        ready = serve.wait_event("ready", timeout=900)
        assert ready, (serve.finish(), serve.stderr_text()[-5000:])
        lp = Loop(tmp, serve, ready, baseline, train_cfg)
        yield lp
    finally:
        runs = [serve] + ([lp.train] if lp is not None and lp.train is not None else [])
        for run in runs:
            run.kill()
            for tag in run.tags():
                supervisor.stop(tag=tag, first=signal.SIGKILL, grace_s=10)
        if lp is not None:
            RESULTS.mkdir(parents=True, exist_ok=True)
            lp.results.update(model=str(model), lora_rank=LORA_RANK)
            name = f"train_loop-{RUN_NAME}.json" if RUN_NAME else "train_loop.json"
            (RESULTS / name).write_text(json.dumps(lp.results, indent=2) + "\n")


def test_batch_one_collected_at_version_0(loop):
    assert loop.version() == 0
    loop.greedy[0] = loop.probe()
    assert loop.probe() == loop.greedy[0], "temperature 0 should be deterministic"
    loop.episodes(1)
    db = loop.ready["data"]["experience_buffer"].removeprefix("sqlite:///")
    for _ in range(30):
        if Path(db).exists() and sqlite3.connect(db).execute("select count(*) from experience_buffer").fetchone()[0] >= BATCH:
            break
        time.sleep(1)
    assert sqlite3.connect(db).execute("select count(*) from experience_buffer").fetchone()[0] == BATCH


def test_train_two_steps_and_serve_follows_without_failed_requests(loop):
    env = rftstack_env(XDG_CACHE_HOME=str(loop.tmp / "cache"))
    client = Client(loop.endpoint, loop.model)
    client.start()
    serve_mib = gpu_memory_used_mib()
    memory = MemorySampler()
    memory.start()
    t_train = time.monotonic()
    loop.train = ServeRun(["-c", str(loop.train_cfg), "--num-gpus", "1"], env, loop.tmp, loop.tmp / "train-run", command="train")
    try:
        started = loop.train.wait_event("training", timeout=600)
        assert started, (loop.train.finish(), loop.train.stderr_text()[-6000:])
        for step in (1, 2):
            while True:
                ev = loop.train.wait_event("checkpoint", timeout=900)
                assert ev, (loop.train.finish(), loop.train.stderr_text()[-6000:])
                loop.sample_numpy()
                if ev["step"] >= step:
                    break
            assert ev["step"] == step
            loop.results[f"checkpoint_{step}_after_train_start_s"] = round(time.monotonic() - t_train, 1)
            loop.wait_version(step, since=time.monotonic())
            loop.greedy[step] = loop.probe()
            if step == 1:
                loop.episodes(2)  # batch 2 comes from the new weights
        rc = loop.train.finish(timeout=600)
        assert rc == 0, loop.train.stderr[-6000:]
    finally:
        client.stop.set()
        memory.stop.set()
        client.join(timeout=360)
    loop.results.update(gpu_used_before_train_mib=serve_mib, gpu_used_peak_mib=memory.peak_mib,
                        trainer_peak_mib=memory.peak_mib - serve_mib, gpu_baseline_mib=loop.baseline_mib)  # fmt: skip
    print(f"GPU memory: {loop.baseline_mib} MiB before serve, {serve_mib} MiB with serve, peak {memory.peak_mib} MiB while training")
    loop.results.update(requests_ok=client.ok, requests_failed=len(client.failures), versions_seen=loop.versions_seen,
                        reload_lag_s=loop.reload_lag_s, greedy=loop.greedy)  # fmt: skip
    assert client.failures == [], client.failures[:5]
    assert client.ok > 0
    assert loop.versions_seen[:1] != [2] and 1 in loop.versions_seen and loop.versions_seen[-1] == 2


def test_trainer_attention_follows_flash_attn(loop):
    """Without flash-attn on the host, the train run's changes.json sets verl's model to sdpa."""
    from rftstack.doctor.checks import trainside
    from rftstack.run import train_config

    changes = json.loads((loop.tmp / "train-run" / "changes.json").read_text())
    attn = [c["new"] for c in changes if c["key"] == train_config.ATTN_KEY]
    assert attn == ([] if trainside.flash_attn_imports() else ["sdpa"]), changes


def test_greedy_output_changed_at_each_reload(loop):
    assert set(loop.greedy) == {0, 1, 2}
    assert loop.greedy[1] != loop.greedy[0]
    assert loop.greedy[2] != loop.greedy[1]


def test_reload_times_from_the_serve_log(loop):
    """Trinity logs `Model 0 begins synchronization` and `Model 0 synchronized to version N` (second resolution)."""
    from rftstack.run import serve_config

    logs = [loop.serve.run_dir / "logs" / "trinity.log", *sorted((Path(serve_config.job_dir(loop.config)) / "log").rglob("*.log"))]
    text = "\n".join(p.read_text(errors="replace") for p in logs if p.is_file())
    stamp = r"(\d\d-\d\d \d\d:\d\d:\d\d)"
    begins = re.findall(stamp + r".*Model 0 begins synchronization", text)
    done = re.findall(stamp + r".*Model 0 synchronized to version (\d+)", text)
    loop.results["reload_log"] = {"begins": begins, "synchronized": done}
    assert re.findall(r"Model 0 synchronized to version (\d+)", text)[-2:] == ["1", "2"]


def test_training_metrics_are_finite(loop):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rftstack.run import serve_config

    tb = Path(serve_config.job_dir(loop.config)) / "monitor" / "tensorboard"
    files = [p for p in tb.rglob("events.out.tfevents.*")]
    assert files, f"no tensorboard events under {tb}"
    scalars: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        acc = EventAccumulator(str(f.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    actor = {k: v for k, v in scalars.items() if k.startswith("actor/")}
    assert actor, sorted(scalars)[:40]
    assert {s for v in actor.values() for s, _ in v} >= {1, 2}
    bad = {k: v for k, v in actor.items() if not all(math.isfinite(x) for _, x in v)}
    assert bad == {}
    step_times = scalars.get("time/train_step", [])
    loop.results["time_train_step_s"] = step_times
    loop.results["actor_metrics"] = {k: v for k, v in actor.items() if k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy")}
    assert step_times and all(x > 0 for _, x in step_times)


def test_trainer_ran_with_the_locked_numpy(loop):
    assert loop.numpy_in_trainer, "numpy not seen in the train run's processes"
    assert all(v.startswith("2.3.") for v in loop.numpy_in_trainer), loop.numpy_in_trainer
    loop.results["numpy_in_trainer"] = sorted(loop.numpy_in_trainer)


def test_no_experience_trained_twice(loop):
    db = loop.ready["data"]["experience_buffer"].removeprefix("sqlite:///")
    con = sqlite3.connect(db)
    rows = con.execute("select consumed, count(*) from experience_buffer group by consumed").fetchall()
    # trinity-sql-read-requeue.patch's record: which rows each step's batch took (each row once)
    steps = con.execute("select step, count(*), count(distinct id) from experience_buffer_reads group by step").fetchall()
    (read_rows,) = con.execute("select count(distinct id) from experience_buffer_reads").fetchone()
    con.close()
    loop.results["consumed_histogram"] = rows
    loop.results["reads_per_step"] = steps
    assert dict(rows) == {1: 2 * BATCH}
    assert steps == [(1, BATCH, BATCH), (2, BATCH, BATCH)] and read_rows == 2 * BATCH


def test_train_stopped_cleanly(loop):
    from rftstack.run import supervisor

    st = json.loads((loop.train.run_dir / "status.json").read_text())
    assert st["phase"] == "stopped" and st["exit_code"] == 0 and st["latest_step"] == 2, st
    assert all(supervisor.tagged(t) == [] for t in loop.train.tags())


def test_serve_stops_and_the_gpu_memory_comes_back(loop):
    from rftstack.run import supervisor

    tags = loop.serve.tags()
    loop.serve.proc.send_signal(signal.SIGINT)
    assert loop.serve.finish(timeout=300) == 0, loop.serve.stderr_text()[-5000:]
    assert all(supervisor.tagged(t) == [] for t in tags)
    back = memory_back_after(loop.baseline_mib, 60)
    loop.results["gpu_memory_back_after_s"] = back
    assert back is not None
