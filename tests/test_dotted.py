"""rftstack.dotted: one meaning of a dotted config key for the doctor's checks and serve's config."""

from __future__ import annotations

from rftstack import dotted

CFG = {"model": {"model_path": "/m", "lora_configs": None}, "explorer": {"rollout_model": 3}, "mode": "serve"}


def test_lookup_tells_absent_from_null():
    assert dotted.lookup(CFG, "model.model_path") == "/m"
    assert dotted.lookup(CFG, "model.lora_configs") is None
    assert dotted.lookup(CFG, "model.max_model_len") is dotted.UNSET
    assert dotted.lookup(CFG, "explorer.rollout_model.model_path") is dotted.UNSET  # a level that is not a mapping
    assert repr(dotted.UNSET) == "UNSET"


def test_get_and_is_set_treat_null_as_absent():
    assert dotted.get(CFG, "mode") == "serve"
    assert dotted.get(CFG, "model.lora_configs", "d") == "d"
    assert dotted.get(CFG, "nothing.here", 7) == 7
    assert dotted.get(CFG, "nothing.here") is None
    assert dotted.is_set(CFG, "model.model_path") and not dotted.is_set(CFG, "model.lora_configs")
    assert dotted.get({"explorer": {"proxy_port": 0}}, "explorer.proxy_port", 8010) == 0  # falsy is a value


def test_put_makes_the_levels_it_needs():
    cfg: dict = {"explorer": {"rollout_model": 3}}
    dotted.put(cfg, "explorer.rollout_model.engine_num", 2)
    dotted.put(cfg, "synchronizer.sync_method", "checkpoint")
    assert cfg == {"explorer": {"rollout_model": {"engine_num": 2}}, "synchronizer": {"sync_method": "checkpoint"}}
