"""The effective config and environment (pure), and real trinity loading the effective config."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rftstack.run import report_config
from rftstack.run import serve_config
from rftstack.errors import UserError


def report(model="/models/Qwen2.5-3B-Instruct"):
    """The user report's config (seeds/000_*.txt) as parsed, with the model path replaced: no
    project/name, so Trinity's defaults (Trinity-RFT/rft) name the checkpoint dirs."""
    return report_config.config(model, project=None, name=None)


def eff(user, **kw):
    args = dict(run_dir="/runs/r1", ray_address="127.0.0.1:6000", proxy_port=8010)
    args.update(kw)
    return serve_config.effective(user, **args)


def test_report_config_changes():
    cfg, changes = eff(report(), model_max_len=32768)
    keys = {c.key for c in changes}
    assert cfg["explorer"]["listen_address"] == "127.0.0.1"
    assert cfg["explorer"]["min_running_model_num"] == 0
    assert cfg["explorer"]["service_status_check_interval"] == 2
    assert cfg["synchronizer"]["sync_method"] == "checkpoint"
    assert cfg["cluster"]["ray_address"] == "127.0.0.1:6000"
    assert cfg["model"]["max_model_len"] == 32768
    assert cfg["checkpoint_root_dir"] == "/runs/r1/checkpoints"
    buf = cfg["buffer"]["trainer_input"]["experience_buffer"]
    assert buf["storage_type"] == "sql"
    assert buf["path"] == "sqlite:////runs/r1/checkpoints/Trinity-RFT/rft/buffer/experience_buffer.db"
    assert {"explorer.listen_address", "explorer.min_running_model_num", "explorer.service_status_check_interval", "synchronizer.sync_method"} <= keys
    assert all(c.why for c in changes)
    assert report()["synchronizer"]["sync_method"] == "nccl"  # the input is not modified


def test_explicit_user_choices_are_kept():
    user = report()
    user["explorer"]["min_running_model_num"] = 1
    user["explorer"]["service_status_check_interval"] = 60
    user["checkpoint_root_dir"] = "/shared/ckpt"
    user["buffer"] = {"trainer_input": {"experience_buffer": {"name": "eb", "storage_type": "queue"}}}
    user["model"]["max_model_len"] = 4096
    cfg, changes = eff(user, model_max_len=32768)
    assert cfg["explorer"]["min_running_model_num"] == 1
    assert cfg["explorer"]["service_status_check_interval"] == 60
    assert "explorer.service_status_check_interval" not in {c.key for c in changes}
    assert cfg["checkpoint_root_dir"] == "/shared/ckpt"
    assert cfg["model"]["max_model_len"] == 4096
    assert cfg["buffer"]["trainer_input"]["experience_buffer"] == {"name": "eb", "storage_type": "queue"}
    warns = " ".join(serve_config.warnings(cfg, expose=False))
    assert "Ray queue" in warns and "never follow new checkpoints" in warns


def test_listen_address_needs_expose():
    user = report()
    user["explorer"]["listen_address"] = "0.0.0.0"
    cfg, changes = eff(user)
    assert cfg["explorer"]["listen_address"] == "127.0.0.1"
    assert any("--expose" in c.why for c in changes)
    cfg, _ = eff(report(), expose=True)
    assert cfg["explorer"]["listen_address"] == "0.0.0.0"
    assert any("anyone who can reach" in w for w in serve_config.warnings(cfg, expose=True))
    user["explorer"]["listen_address"] = "::1"
    cfg, changes = eff(user)
    assert cfg["explorer"]["listen_address"] == "::1" and "explorer.listen_address" not in {c.key for c in changes}


@pytest.mark.parametrize(
    "user, match",
    [({"mode": "train", "model": {"model_path": "/m"}}, "mode: serve"), ({"mode": "serve"}, "model_path"), ([1, 2], "mapping")],
)
def test_configs_serve_cannot_run(user, match):
    with pytest.raises(UserError, match=match):
        eff(user)


def test_environment_decisions():
    ray_env = {"RAY_ADDRESS": "127.0.0.1:1", "RAY_AUTH_MODE": "token"}
    env, notes = serve_config.environment({"PATH": "/bin", "RAY_AUTH_TOKEN": "leak"}, ray_env=ray_env, tag="t", nvcc=None)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["RFTSTACK_TAG"] == "t" and env["RAY_ADDRESS"] == "127.0.0.1:1" and "RAY_AUTH_TOKEN" not in env
    env, _ = serve_config.environment({}, ray_env=ray_env, tag="t", nvcc="/usr/local/cuda/bin/nvcc")
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in env
    env, _ = serve_config.environment({"VLLM_USE_FLASHINFER_SAMPLER": "1"}, ray_env=ray_env, tag="t", nvcc=None)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    # --expose opens the proxy only: the engines' hosts and the rendezvous stay on loopback
    exposed, _ = serve_config.environment({}, ray_env=ray_env, tag="t", nvcc=None, expose=True)
    assert (exposed["VLLM_HOST_IP"], exposed["GLOO_SOCKET_IFNAME"], exposed["NCCL_SOCKET_IFNAME"]) == ("127.0.0.1", "lo", "lo")


def test_environment_pins_the_explorer_unless_the_user_chose():
    """RFTSTACK_EXPLORER_NODE (read by trinity-explorer-node.patch): serve's node, unless the
    environment already has a value (an empty one: Ray places the explorer, as upstream)."""
    ray_env = {"RAY_ADDRESS": "10.0.0.1:6379"}
    env, notes = serve_config.environment({}, ray_env=ray_env, tag="t", nvcc="nvcc", explorer_node="10.0.0.1")
    assert env["RFTSTACK_EXPLORER_NODE"] == "10.0.0.1" and any("RFTSTACK_EXPLORER_NODE=10.0.0.1" in n for n in notes)
    env, notes = serve_config.environment({"RFTSTACK_EXPLORER_NODE": ""}, ray_env=ray_env, tag="t", nvcc="nvcc", explorer_node="10.0.0.1")
    assert env["RFTSTACK_EXPLORER_NODE"] == "" and any("where Ray places it" in n for n in notes)
    env, _ = serve_config.environment({}, ray_env=ray_env, tag="t", nvcc="nvcc")
    assert "RFTSTACK_EXPLORER_NODE" not in env  # train: no explorer


TRINITY_CHECK = r"""
import json, sys
from trinity.common.config import load_config
cfg = load_config(sys.argv[1])
cfg.check_and_update()
eb = cfg.buffer.trainer_input.experience_buffer
print("RESULT " + json.dumps({
    "listen_address": cfg.explorer.listen_address,
    "min_running_model_num": cfg.explorer.min_running_model_num,
    "service_status_check_interval": cfg.explorer.service_status_check_interval,
    "sync_method": str(cfg.synchronizer.sync_method.value),
    "enable_openai_api": cfg.explorer.rollout_model.enable_openai_api,
    "ray_address": cfg.cluster.ray_address,
    "eb_storage": str(eb.storage_type), "eb_path": eb.path,
    "cache_dir": cfg.buffer.cache_dir,
    "max_model_len": cfg.model.max_model_len,
}))
"""


@pytest.mark.slow
def test_real_trinity_accepts_the_effective_report_config(tmp_path, tiny_model):
    from rftstack.run.serve import model_max_len

    cfg, _ = serve_config.effective(
        report(str(tiny_model)), run_dir=str(tmp_path), ray_address="127.0.0.1:6000", proxy_port=18010,
        model_max_len=model_max_len(str(tiny_model)),
    )  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-c", TRINITY_CHECK, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[0][7:])
    assert got["listen_address"] == "127.0.0.1"
    assert got["min_running_model_num"] == 0
    assert got["service_status_check_interval"] == 2
    assert got["sync_method"] == "checkpoint"
    assert got["enable_openai_api"] is True
    assert got["ray_address"] == "127.0.0.1:6000"
    assert "sql" in got["eb_storage"].lower()
    # the durable buffer sits in trinity's own buffer dir, next to proxy_history.db
    assert got["eb_path"] == "sqlite:///" + got["cache_dir"] + "/experience_buffer.db"
    assert got["cache_dir"].startswith(str(tmp_path))
    assert got["max_model_len"] == 2048


def test_restart_with_the_same_checkpoint_root_reuses_the_same_stores(tmp_path, tiny_model):
    """Two serves (new run directories) of a config that sets checkpoint_root_dir get the same job
    directory and the same stores; Trinity's own GlobalConfigValidator (guards upstream: its
    continue_from_checkpoint defaults to true) keeps that job directory when it already holds the
    first serve's files instead of renaming the experiment `<name>_<timestamp>`."""
    from trinity.common.config import load_config
    from trinity.common.config_validator import GlobalConfigValidator

    user = {**report(str(tiny_model)), "checkpoint_root_dir": str(tmp_path / "data")}
    runs = [serve_config.effective(user, run_dir=str(tmp_path / f"run{i}"), ray_address="127.0.0.1:6000", proxy_port=18010,
                                   model_max_len=2048)[0] for i in (0, 1)]  # fmt: skip
    assert runs[0] == runs[1] and "continue_from_checkpoint" not in runs[0]
    job = serve_config.job_dir(runs[0])
    os.makedirs(job + "/buffer")
    (Path(job) / "buffer" / "proxy_history.db").write_bytes(b"")  # the first serve's store
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(runs[1]))
    cfg = load_config(str(path))
    GlobalConfigValidator().validate(cfg)
    assert cfg.checkpoint_job_dir == job and cfg.name == runs[1].get("name", "rft")
    cfg.continue_from_checkpoint = False  # what a config that sets it false would get: a new experiment
    GlobalConfigValidator().validate(cfg)
    assert cfg.checkpoint_job_dir != job


def test_the_embedded_default_follows_expose():
    """The embedded default (no -c) names no listen address, so --expose opens it like any config
    without one (it pinned 127.0.0.1 before, and `serve --expose` without -c stayed on loopback)."""
    user = serve_config.default_config("/models/tiny", gpus=1)
    assert "listen_address" not in user["explorer"]
    closed, _ = serve_config.effective(user, run_dir="/r", ray_address="127.0.0.1:1", proxy_port=8010)
    opened, _ = serve_config.effective(user, run_dir="/r", ray_address="127.0.0.1:1", proxy_port=8010, expose=True)
    assert closed["explorer"]["listen_address"] == "127.0.0.1" and opened["explorer"]["listen_address"] == "0.0.0.0"
