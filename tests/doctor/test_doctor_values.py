"""The doctor's value rules (rftstack.checks.values) against the real Trinity 0.6.0 and vLLM 0.23.0:
every key a rule names is a field of Trinity's config dataclasses, every vLLM range is the one
vLLM's own classes enforce, each rule refuses a bad value in one line and accepts its example, and
`rftstack doctor -c` fails the report's config with `gpu_memory_utilization: 1.5` or
`engine_num: 0` in about a second (Trinity's slow subprocess is not run for such a config)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import typing

import pytest
import yaml

from rftstack.run import report_config
from rftstack.doctor.checks import config as config_check
from rftstack.doctor.checks import model, values
from rftstack.doctor.checks import vllm_api
from rftstack.findings import FAIL, OK

CANDIDATES = [None, "x", -5, 0, 1.5, True, 70000, {"a": 1}]


def nest(key: str, value) -> dict:
    out: dict = {}
    cur = out
    parts = key.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def failures(found):
    return [f for f in found if f.status == FAIL]


@pytest.mark.parametrize("rule", values.RULES, ids=lambda r: r.key)
def test_each_rule_refuses_a_bad_value_in_one_line_and_accepts_its_example(rule):
    bad = [v for v in CANDIDATES if not (v is None and rule.nullable) and (v is None or not rule.ok(v))]
    assert bad, f"{rule.key}: no candidate is refused, the rule cannot fail"
    for v in bad:
        (f,) = failures(values.check_rules(nest(rule.key, v)))
        assert f.data["key"] == rule.key and f"`{rule.key}`" in f.message and rule.key in f.fix
        assert "\n" not in f.message + f.fix and f.message.endswith(".") and f.fix.endswith(".")
    example = yaml.safe_load(f"v: {rule.example}")["v"]
    assert failures(values.check_rules(nest(rule.key, example))) == [], rule.example


def _trinity_class(section: str):
    from trinity.common.config import ClusterConfig, InferenceModelConfig, ModelConfig, SynchronizerConfig

    return {"model": ModelConfig, "cluster": ClusterConfig, "explorer.rollout_model": InferenceModelConfig,
            "synchronizer": SynchronizerConfig}[section]


@pytest.mark.parametrize("rule", values.RULES, ids=lambda r: r.key)
def test_each_rule_names_a_field_of_trinitys_config_classes(rule):
    section, field = rule.key.rsplit(".", 1)
    names = {f.name for f in dataclasses.fields(_trinity_class(section))}
    assert field in names, f"{rule.key} is not a field of {_trinity_class(section).__name__}"


def test_trinitys_own_values_for_enums_are_the_rules():
    """Guards upstream: the engine types, sync methods and styles the rules accept are Trinity's."""
    from trinity.common.constants import SyncMethod, SyncStyle

    assert {m.value for m in SyncMethod} <= set(values.SYNC_METHODS)
    assert {s.value for s in SyncStyle} <= set(values.SYNC_STYLES)
    assert {"vllm", "sglang", "tinker", "external"} == set(values.ENGINE_TYPES)


def test_vllm_ranges_are_vllms_own():
    """Guards upstream: each vLLM range in the rules is what vLLM 0.23.0's own classes refuse."""
    import pydantic
    from vllm import SamplingParams
    from vllm.config.cache import CacheConfig
    from vllm.config.model import ModelDType

    rule = {r.key: r for r in values.RULES}
    for v in (1.5, 0, -0.1, 1.0, 0.3):
        try:
            CacheConfig(gpu_memory_utilization=v)
            vllm_ok = True
        except (pydantic.ValidationError, ValueError):
            vllm_ok = False
        assert rule["explorer.rollout_model.gpu_memory_utilization"].ok(v) == vllm_ok, v
    assert set(typing.get_args(ModelDType)) == set(values.VLLM_DTYPES)
    for key, cases in {"top_p": (0, 0.5, 1, 1.01), "temperature": (-0.1, 0, 2.0), "top_k": (-2, -1, 0, 5),
                       "repetition_penalty": (0, -1, 1.2)}.items():
        for v in cases:
            try:
                SamplingParams(**{key: v})
                vllm_ok = True
            except (ValueError, TypeError):
                vllm_ok = False
            assert rule[f"model.{key}"].ok(v) == vllm_ok, (key, v)


def test_gpus_needed_against_gpus_configured_and_present():
    cfg = {"cluster": {"node_num": 1, "gpu_per_node": 2}, "explorer": {"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2}}}
    (f,) = failures(values.check_combinations(cfg, gpus_present=None, model_max_len=None, engine_args=None))
    assert "need 4 GPU(s)" in f.message and "gives 2" in f.message
    found = failures(values.check_combinations(cfg, gpus_present=1, model_max_len=None, engine_args=None))
    assert [f.data["key"] for f in found] == ["cluster", "cluster.gpu_per_node"]
    no_cluster = {"explorer": {"rollout_model": {"tensor_parallel_size": 2}}}
    (f,) = failures(values.check_combinations(no_cluster, gpus_present=1, model_max_len=None, engine_args=None))
    assert "this machine has 1" in f.message
    assert failures(values.check_combinations(no_cluster, gpus_present=2, model_max_len=None, engine_args=None)) == []


def test_token_lengths_tool_choice_and_engine_args():
    names = values.engine_arg_names(vllm_api.package_dir("vllm"))
    assert {"max_num_seqs", "gpu_memory_utilization", "enforce_eager"} <= names
    cfg = {"model": {"max_model_len": 4096, "max_prompt_tokens": 3000, "max_response_tokens": 2000},
           "explorer": {"rollout_model": {"enable_auto_tool_choice": True, "max_model_len": 65536,
                                          "extra_engine_args": {"max_num_seqs": 64, "max_num_seq": 64}}}}
    keys = [f.data["key"] for f in failures(values.check_combinations(cfg, gpus_present=None, model_max_len=32768, engine_args=names))]
    assert keys == ["model.max_model_len", "explorer.rollout_model.max_model_len",
                    "explorer.rollout_model.tool_call_parser", "explorer.rollout_model.extra_engine_args.max_num_seq"]


def test_trinitys_multiline_type_error_becomes_one_line(tmp_path, tiny_model):
    """Trinity's load_config (OmegaConf) refuses `engine_num: two` in a multi-line message; the
    doctor's finding is its first line with the key."""
    from trinity.common.config import load_config

    cfg = report_config.config(tiny_model, max_model_len=2048, project=None, name=None, checkpoint_root_dir=tmp_path / "ckpt")
    cfg["explorer"]["rollout_model"]["engine_num"] = "two"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(Exception) as info:
        load_config(str(p))
    line = config_check.one_line(str(info.value))
    assert "\n" not in line and "engine_num" in line
    (f, *_) = config_check.check_trinity({"error": str(info.value)}, cfg, {}, str(p))
    assert f.status == FAIL and "\n" not in f.message


def test_model_path_that_is_a_file(tmp_path, tiny_model):
    (f,) = model.check(str(tiny_model / "config.json"), registry_source=None)
    assert f.status == FAIL and "is a file, not a directory" in f.message


@pytest.mark.parametrize("key,value,says", [
    ("gpu_memory_utilization", 1.5, "`explorer.rollout_model.gpu_memory_utilization` is 1.5"),
    ("engine_num", 0, "`explorer.rollout_model.engine_num` is 0"),
])
def test_doctor_cli_fails_such_a_config_fast(tmp_path, tiny_model, key, value, says):
    cfg = report_config.config(tiny_model, max_model_len=2048, project=None, name=None, checkpoint_root_dir=tmp_path / "ckpt")
    cfg["explorer"]["rollout_model"][key] = value
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rftstack", "doctor", "-c", str(p), "--skip", "ray"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 1
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("[FAIL] config.value")]
    assert len(line) == 1 and says in line[0], r.stdout
    assert "did not run: fix the values above first" in r.stdout and "checking the config with Trinity" not in r.stderr
    assert took < 12, took  # no 15 s Trinity subprocess


def test_a_clean_config_has_one_ok_value_line(tmp_path, tiny_model):
    cfg = report_config.config(tiny_model, max_model_len=2048, project=None, name=None, checkpoint_root_dir=tmp_path / "ckpt")
    found = values.check(cfg, gpus_present=1, model_max_len=32768, engine_args=values.engine_arg_names(vllm_api.package_dir("vllm")))
    assert [f.status for f in found] == [OK]
