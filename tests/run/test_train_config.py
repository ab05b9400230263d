"""The train config that pairs with a serve config, checked by Trinity's own code, and the data path
between them: what a serve records and commits is what the trainer's reader reads, once.

Real (in a subprocess, as Trinity's imports are heavy): Trinity 0.6.0's `load_config` +
`check_and_update` on both effective configs; its proxy app and ExplorerService methods
(record_experience, record_feedback, submit_experiences) with its HistoryRecorder; its
ExperiencePipeline (what the serve's RolloutCoordinator runs at /commit) writing the SQL experience
store; and `trinity.buffer.get_buffer_reader` on the train config's experience buffer, the reader
the trainer's DefaultSampleStrategy builds.
TEST DOUBLES: vLLM (tests/doubles/vllm_stream_double.py) and the Explorer/Coordinator objects
around the service. One deviation from a deployment: the SQL storage runs in this process
(`wrap_in_ray: false`) instead of in a Ray actor; the storage class and its read/write code are the
same (trinity/buffer/storage/sql.py SQLExperienceStorage).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import REPO, run_cli, run_python
from rftstack.run import report_config, serve_config, train_config
from rftstack.run.serve_config import ConfigError

MODEL = "/models/Qwen2.5-3B-Instruct"


def pair(tmp_path: Path, model: str, **train_kw) -> tuple[dict, dict]:
    """The effective serve and train configs of one checkpoint root."""
    ckpt = str(tmp_path / "ckpt")
    serve_user = report_config.config(model, max_model_len=2048, checkpoint_root_dir=ckpt, algorithm=train_config.ALGORITHM)
    serve_cfg, _ = serve_config.effective(serve_user, run_dir=str(tmp_path / "serve-run"), ray_address="127.0.0.1:1", proxy_port=18010)
    train_user = train_config.example(model, checkpoint_root_dir=ckpt, project=report_config.REPORT_PROJECT,
                                      name=report_config.REPORT_NAME, max_model_len=2048, **train_kw)  # fmt: skip
    train_cfg, _ = train_config.effective(train_user, ray_address="127.0.0.1:2")
    return serve_cfg, train_cfg


def test_the_pair_meets_in_one_job_dir_and_store(tmp_path):
    serve_cfg, train_cfg = pair(tmp_path, MODEL)
    assert serve_config.job_dir(serve_cfg) == serve_config.job_dir(train_cfg) == f"{tmp_path}/ckpt/report/qwen3b"
    s_buf = serve_cfg["buffer"]["trainer_input"]["experience_buffer"]
    assert s_buf == train_cfg["buffer"]["trainer_input"]["experience_buffer"]
    assert s_buf["path"] == f"sqlite:///{tmp_path}/ckpt/report/qwen3b/buffer/experience_buffer.db"
    assert serve_cfg["algorithm"]["algorithm_type"] == train_cfg["algorithm"]["algorithm_type"] == "reinforceplusplus"
    assert train_cfg["continue_from_checkpoint"] is True
    assert train_cfg["trainer"]["save_interval"] == 1 and train_cfg["synchronizer"]["sync_interval"] == 1
    assert train_cfg["cluster"] == {"node_num": 1, "gpu_per_node": 1, "ray_address": "127.0.0.1:2"}


def test_effective_records_what_it_sets(tmp_path):
    user = {"model": {"model_path": MODEL}, "checkpoint_root_dir": "/c", "buffer": {"train_batch_size": 4}}
    cfg, changes = train_config.effective(user, ray_address="127.0.0.1:2", gpus=2)
    got = {c.key: c.new for c in changes}
    assert got["mode"] == "train" and got["cluster.gpu_per_node"] == 2 and got["continue_from_checkpoint"] is True
    assert got["trainer.save_interval"] == 1
    assert got["buffer.trainer_input.experience_buffer"]["path"] == "sqlite:////c/Trinity-RFT/rft/buffer/experience_buffer.db"
    assert all(c.why for c in changes) and user == {"model": {"model_path": MODEL}, "checkpoint_root_dir": "/c", "buffer": {"train_batch_size": 4}}


@pytest.mark.parametrize(
    "user, sentence",
    [
        ({"mode": "serve"}, "the config's mode is 'serve', rftstack train runs mode: train"),
        ({"model": {}}, "the config has no model.model_path"),
        ({"checkpoint_root_dir": ""}, "the config has no checkpoint_root_dir; set it to the serve's"),
        ({"buffer": {}}, "buffer.train_batch_size is None; set the number of experiences per training step"),
        ({"buffer": {"train_batch_size": 4, "trainer_input": {"experience_buffer": {"storage_type": "queue"}}}}, "is not an SQL store"),
    ],
)
def test_configs_train_cannot_run_are_one_sentence(user, sentence):
    base = {"model": {"model_path": MODEL}, "checkpoint_root_dir": "/c", "buffer": {"train_batch_size": 4}}
    with pytest.raises(ConfigError, match=sentence.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        train_config.effective({**base, **user}, ray_address="a")


TRINITY_CHECK = r"""
import json, sys
from trinity.common.config import load_config
out = {}
for side in ("serve", "train"):
    cfg = load_config(sys.argv[1] + f"/{side}.yaml")
    cfg.check_and_update()
    eb = cfg.buffer.trainer_input.experience_buffer
    out[side] = {"mode": cfg.mode, "job_dir": cfg.checkpoint_job_dir, "name": cfg.name, "algorithm": cfg.algorithm.algorithm_type,
                 "eb_path": eb.path, "eb_schema": eb.schema_type, "eb_batch": eb.batch_size, "sync": str(cfg.synchronizer.sync_method.value),
                 "save_interval": cfg.trainer.save_interval, "total_steps": cfg.trainer.total_steps,
                 "trainer_gpus": cfg.cluster.trainer_gpu_num, "lora": bool(cfg.model.lora_configs)}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("lora", [None, 8])
def test_trinity_accepts_the_pair(tmp_path, tiny_model, lora):
    serve_cfg, train_cfg = pair(tmp_path, str(tiny_model), train_batch_size=4, total_steps=3, lora_rank=lora)
    if lora:
        serve_cfg["model"]["lora_configs"] = train_cfg["model"]["lora_configs"]
    for side, cfg in (("serve", serve_cfg), ("train", train_cfg)):
        (tmp_path / f"{side}.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "ckpt/report/qwen3b/buffer").mkdir(parents=True)  # the serve started first: the job dir is in use
    out = run_python(TRINITY_CHECK, str(tmp_path), timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[0][7:])
    s, t = got["serve"], got["train"]
    assert (s["mode"], t["mode"]) == ("serve", "train")  # not turned into colocate
    assert s["job_dir"] == t["job_dir"] and s["name"] == t["name"] == "qwen3b"  # no rename: continue_from_checkpoint
    assert s["eb_path"] == t["eb_path"] and t["eb_schema"] == "experience" and t["eb_batch"] == 4
    assert s["algorithm"] == t["algorithm"] == "reinforceplusplus"
    assert t["sync"] == "checkpoint" and t["save_interval"] == 1 and t["total_steps"] == 3 and t["trainer_gpus"] == 1
    assert t["lora"] is bool(lora)


def test_cli_writes_the_pair(tmp_path, tiny_model):
    ckpt = tmp_path / "ckpt"
    r = run_cli("example-config", str(tiny_model), "--train", "--checkpoint-root-dir", str(ckpt), "--train-batch-size", "4",
                "--total-steps", "3", "-o", str(tmp_path / "train.yaml"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == f"wrote {tmp_path / 'train.yaml'}; start it with: rftstack train -c {tmp_path / 'train.yaml'}"
    r2 = run_cli("example-config", str(tiny_model), "--for-training", "--checkpoint-root-dir", str(ckpt), "-o", str(tmp_path / "serve.yaml"))
    assert r2.returncode == 0, r2.stderr
    t, s = yaml.safe_load((tmp_path / "train.yaml").read_text()), yaml.safe_load((tmp_path / "serve.yaml").read_text())
    assert t == train_config.example(tiny_model.resolve(), checkpoint_root_dir=str(ckpt), project="report", name="qwen3b",
                                     train_batch_size=4, total_steps=3)  # fmt: skip
    assert (s["project"], s["name"], s["checkpoint_root_dir"], s["algorithm"]["algorithm_type"]) == \
        (t["project"], t["name"], t["checkpoint_root_dir"], t["algorithm"]["algorithm_type"])  # fmt: skip
    r3 = run_cli("example-config", str(tiny_model), "--train")
    assert r3.returncode == 2 and r3.stderr == ("rftstack example-config: --train and --for-training need --checkpoint-root-dir DIR "
                                                "(serve and train meet there); pass the same DIR to both\n")  # fmt: skip


ROUND_TRIP = r"""
import asyncio, json, sys
from collections import deque
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import httpx
from trinity.common.config import load_config
from trinity.buffer import get_buffer_reader
from trinity.buffer.pipelines.experience_pipeline import ExperiencePipeline
from trinity.explorer.proxy import app as proxy_app
from trinity.explorer.proxy.recorder import HistoryRecorder
from trinity.explorer.proxy.service import ExplorerService
from vllm_stream_double import VLLMStreamDouble, MODEL_ID

tmp = Path(sys.argv[1])
serve_cfg = load_config(str(tmp / "serve.yaml")); serve_cfg.check_and_update()
train_cfg = load_config(str(tmp / "train.yaml")); train_cfg.check_and_update()
from trinity.buffer.buffer import get_buffer_writer

def local(cfg):
    # the storage config Trinity derives, run in this process (the deviation named in the docstring)
    sc = cfg.to_storage_config() if hasattr(cfg, "to_storage_config") else cfg
    sc.wrap_in_ray = False
    return sc

eb = local(train_cfg.buffer.trainer_input.experience_buffer)
eb.max_read_timeout = 3

async def main():
    pipeline = ExperiencePipeline(serve_cfg)
    pipeline.output = get_buffer_writer(local(serve_cfg.buffer.trainer_input.experience_buffer))
    if pipeline.input_store is not None:
        pipeline.input_store = get_buffer_writer(local(pipeline.input_store._config))
    await pipeline.prepare()

    class Coordinator:  # TEST DOUBLE of the Ray actor handle: .remote runs Trinity's pipeline
        class process_experiences:
            remote = staticmethod(pipeline.process_serialized_chunks)

    class Explorer:
        explore_step_num = 0
        rollout_coordinator = Coordinator()
        class monitor:
            @staticmethod
            def log(metrics, step): pass

    class Service:
        record_experience = ExplorerService.record_experience
        record_feedback = ExplorerService.record_feedback
        submit_experiences = ExplorerService.submit_experiences
        collect_metrics = ExplorerService.collect_metrics
        def __init__(self):
            self.explorer, self.models = Explorer(), []
            self.total_experience_count = self.ready_experience_count = 0
            self.commit_lock = asyncio.Lock()
            self.ready_experiences = deque()
            self.recorder = HistoryRecorder(db_url=serve_cfg.explorer.db_url or f"sqlite:///{serve_cfg.buffer.cache_dir}/proxy_history.db", table_name="proxy_history")
        async def allocate_model(self, increase_count=True):
            return up.base_url, 0

    sent = {}
    with VLLMStreamDouble() as up:
        app = proxy_app.app
        app.state.service, app.state.temperature, app.state.inference_timeout, app.state.models_cache = Service(), 1.0, 30, None
        app.state.http_client = httpx.AsyncClient()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            for batch in range(2):
                for i in range(3):
                    n = batch * 3 + i
                    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": f"question {n}"}], "max_tokens": 3 + n, "stream": n % 2 == 1}
                    r = await c.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
                    rid = r.json()["id"] if not body["stream"] else json.loads([l for l in r.text.splitlines() if l.startswith("data: {")][0][6:])["id"]
                    fb = await c.post("/feedback", json={"msg_ids": [rid], "reward": 0.25 * n, "task_id": f"task-{n}"})
                    assert fb.status_code == 200, fb.text
                    sent[rid] = {**up.sent[rid], "reward": 0.25 * n}
                assert (await c.post("/commit")).status_code == 200
        await app.state.http_client.aclose()
    await pipeline.close()

    reader = get_buffer_reader(eb)
    batches = []
    for _ in range(3):
        try:
            exps = await reader.read()
        except StopAsyncIteration:
            batches.append("stop")
            break
        batches.append([{"msg_id": e.eid.suffix, "tokens": e.tokens.tolist(), "prompt_length": e.prompt_length,
                         "logprobs": [round(x, 5) for x in e.logprobs.tolist()], "reward": e.reward} for e in exps])
    import ray
    assert not ray.is_initialized()  # nothing above went through Ray
    print("RESULT " + json.dumps({"sent": sent, "batches": batches}))

asyncio.run(main())
"""


@pytest.mark.slow
def test_committed_experiences_are_read_by_the_trainer_reader_complete_and_once(tmp_path, tiny_model):
    serve_cfg, train_cfg = pair(tmp_path, str(tiny_model), train_batch_size=3)
    for side, cfg in (("serve", serve_cfg), ("train", train_cfg)):
        (tmp_path / f"{side}.yaml").write_text(yaml.safe_dump(cfg))
    out = run_python(ROUND_TRIP, str(tmp_path), str(REPO / "tests" / "doubles"), timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    got = json.loads(lines[0][7:])
    sent, batches = got["sent"], got["batches"]
    assert len(sent) == 6 and len(batches) == 3 and batches[2] == "stop"  # two full batches, then nothing more
    read = [e for b in batches[:2] for e in b]
    assert sorted(e["msg_id"] for e in read) == sorted(sent)  # each committed experience exactly once
    for e in read:
        s = sent[e["msg_id"]]
        assert e["prompt_length"] == len(s["prompt_token_ids"])
        assert e["tokens"] == s["prompt_token_ids"] + s["token_ids"]
        assert e["logprobs"] == [round(x, 5) for x in s["logprobs"]]
        assert e["reward"] == pytest.approx(s["reward"])
    # the second commit's experiences come first (the reader takes the newest unconsumed rows)
    assert {e["msg_id"] for e in batches[0]} == set(list(sent)[3:])


def test_memory_estimate_for_the_reports_card():
    """docs/train.md's estimates: a 3B model (3.09e9 parameters) beside a serve at 0.60 of a 48 GB
    card (49140 MiB, about 19600 MiB left): full fine-tune does not fit, LoRA does."""
    from rftstack.doctor.checks import trainside

    params, free, total = 3_090_000_000, 49140 - int(0.60 * 49140), 49140
    assert trainside.need_mib(params, lora=False) == 56115 and trainside.need_mib(params, lora=True) == 9555
    (full,) = trainside.check_memory(params, False, free, total)
    assert full.status == "fail" and "train with LoRA" in full.fix and "(estimate)" in full.message
    (lora,) = trainside.check_memory(params, True, free, total)
    assert lora.status == "ok"
    (tiny,) = trainside.check_memory(None, False, free, total)
    assert tiny.status == "warn"


def test_count_params_reads_safetensors_headers(tiny_model):
    from safetensors.torch import load_file

    from rftstack.doctor.checks import trainside

    sd = load_file(str(tiny_model / "model.safetensors"))
    assert trainside.count_params(tiny_model) == sum(t.numel() for t in sd.values()) > 0
