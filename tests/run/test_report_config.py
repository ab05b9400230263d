"""rftstack.run.report_config: the report's serve config as one function, validated by the real Trinity
in a subprocess (conftest.run_python, as tests/stack/test_serve_path.py does), and `rftstack example-config`
run as a user would (conftest.run_cli)."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import run_cli, run_python
from rftstack.run import report_config

MODEL = "/models/Qwen2.5-3B-Instruct"


def flat(d: dict, prefix: str = "") -> dict:
    """Nested mapping -> {"a.b.c": leaf}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_defaults_are_the_report_config():
    assert report_config.config(MODEL) == {
        "mode": "serve",
        "project": "report",
        "name": "qwen3b",
        "model": {"model_path": MODEL},
        "cluster": {"node_num": 1, "gpu_per_node": 1},
        "explorer": {"rollout_model": {"engine_num": 1, "enable_openai_api": True, "gpu_memory_utilization": 0.60}},
        "synchronizer": {"sync_method": "nccl"},
    }


@pytest.mark.parametrize(
    "kw, value, key, expected",
    [
        ("max_model_len", 4096, "model.max_model_len", 4096),
        ("checkpoint_root_dir", "/data/ckpt", "checkpoint_root_dir", "/data/ckpt"),
        ("temperature", 0.7, "model.temperature", 0.7),
        ("project", "p", "project", "p"),
        ("project", None, "project", None),
        ("name", "n", "name", "n"),
        ("name", None, "name", None),
        ("gpu_memory_utilization", 0.5, "explorer.rollout_model.gpu_memory_utilization", 0.5),
        ("sync_method", "checkpoint", "synchronizer.sync_method", "checkpoint"),
        ("explorer", {"service_status_check_interval": 5}, "explorer.service_status_check_interval", 5),
    ],
)
def test_each_keyword_changes_exactly_its_key(kw, value, key, expected):
    base = flat(report_config.config(MODEL))
    got = flat(report_config.config(MODEL, **{kw: value}))
    changed = {k for k in base.keys() | got.keys() if base.get(k, "<absent>") != got.get(k, "<absent>")}
    assert changed == {key}
    if expected is None:
        assert key not in got  # None leaves the key out (Trinity's default applies)
    else:
        assert got[key] == expected


def test_render_and_write_round_trip(tmp_path):
    text = report_config.render(MODEL, max_model_len=2048)
    assert yaml.safe_load(text) == report_config.config(MODEL, max_model_len=2048)
    assert list(yaml.safe_load(text)) == ["mode", "project", "name", "model", "cluster", "explorer", "synchronizer"]
    path = report_config.write(tmp_path / "a" / "b" / "qwen3b.yaml", MODEL, max_model_len=2048)
    assert path == tmp_path / "a" / "b" / "qwen3b.yaml" and path.read_text() == text


TRINITY_VALIDATE = """
import json, sys
from trinity.common.config import load_config
for path in sys.argv[1:]:
    c = load_config(path)
    before = c.synchronizer.sync_method.value
    c.check_and_update()
    print("RESULT " + json.dumps({
        "mode": c.mode, "project": c.project, "name": c.name, "checkpoint_root_dir": c.checkpoint_root_dir,
        "model_path": c.model.model_path, "max_model_len": c.model.max_model_len, "temperature": c.model.temperature,
        "engine_num": c.explorer.rollout_model.engine_num, "openai": c.explorer.rollout_model.enable_openai_api,
        "gpu_memory_utilization": c.explorer.rollout_model.gpu_memory_utilization,
        "service_status_check_interval": c.explorer.service_status_check_interval,
        "sync_before": before, "sync_after": c.synchronizer.sync_method.value,
    }))
"""


def test_real_trinity_validates_the_rendered_config(tmp_path, tiny_model):
    """Trinity's own load_config + check_and_update, in a fresh interpreter: the defaults (with the
    max_model_len Trinity needs) and every keyword set at once."""
    plain = report_config.write(tmp_path / "plain.yaml", tiny_model, max_model_len=2048, checkpoint_root_dir=tmp_path / "ckpt")
    every = report_config.write(
        tmp_path / "every.yaml", tiny_model, max_model_len=1024, checkpoint_root_dir=tmp_path / "ckpt2", temperature=0.7,
        project="p", name="n", gpu_memory_utilization=0.5, explorer={"service_status_check_interval": 5},
    )  # fmt: skip
    r = run_python(TRINITY_VALIDATE, str(plain), str(every))
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads(line.removeprefix("RESULT ")) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(got) == 2, r.stdout[-3000:]
    common = {"mode": "serve", "model_path": str(tiny_model), "engine_num": 1, "openai": True,
              "sync_before": "nccl", "sync_after": "checkpoint"}  # fmt: skip
    assert got[0] == {**got[0], **common, "project": "report", "name": "qwen3b", "max_model_len": 2048,
                      "checkpoint_root_dir": str(tmp_path / "ckpt"), "gpu_memory_utilization": 0.6}  # fmt: skip
    assert got[1] == {**got[1], **common, "project": "p", "name": "n", "max_model_len": 1024, "temperature": 0.7,
                      "checkpoint_root_dir": str(tmp_path / "ckpt2"), "gpu_memory_utilization": 0.5,
                      "service_status_check_interval": 5}  # fmt: skip


# ------------------------------------------------------------------ rftstack example-config


def test_cli_prints_the_config_to_stdout(tiny_model):
    r = run_cli("example-config", str(tiny_model), "--max-model-len", "2048")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout) == report_config.config(tiny_model.resolve(), max_model_len=2048)
    assert r.stdout == report_config.render(tiny_model.resolve(), max_model_len=2048)


def test_cli_writes_the_output_file(tmp_path, tiny_model):
    out = tmp_path / "cfg" / "qwen3b.yaml"
    r = run_cli("example-config", str(tiny_model), "-o", str(out), "--gpu-memory-utilization", "0.5",
                "--checkpoint-root-dir", str(tmp_path / "ckpt"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip() == f"wrote {out}; start it with: rftstack serve -c {out}"
    assert yaml.safe_load(out.read_text()) == report_config.config(
        tiny_model.resolve(), gpu_memory_utilization=0.5, checkpoint_root_dir=str(tmp_path / "ckpt")
    )


def test_cli_keeps_an_existing_output_file(tmp_path, tiny_model):
    out = tmp_path / "qwen3b.yaml"
    out.write_text("mine\n")
    r = run_cli("example-config", str(tiny_model), "-o", str(out))
    assert r.returncode == 2
    assert r.stderr == f"rftstack example-config: {out} already exists; pass another --output or remove it first\n"
    assert out.read_text() == "mine\n"


def test_cli_refuses_a_directory_without_config_json(tmp_path):
    d = tmp_path / "not-a-model"
    d.mkdir()
    out = tmp_path / "qwen3b.yaml"
    r = run_cli("example-config", str(d), "-o", str(out))
    assert r.returncode == 2
    assert r.stderr == (f"rftstack example-config: {d} has no config.json; "
                        "pass a local model directory (rftstack tiny-model DIR writes one)\n")  # fmt: skip
    assert not out.exists()


def test_cli_refuses_a_gpu_share_outside_0_1(tiny_model):
    r = run_cli("example-config", str(tiny_model), "--gpu-memory-utilization", "60")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("rftstack example-config: --gpu-memory-utilization 60.0 is outside (0, 1]; "
                        "pass a fraction such as 0.60\n")  # fmt: skip
