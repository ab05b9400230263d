"""The effective config of a train run, and the train config that pairs with a serve config.

`rftstack train` runs Trinity's `mode: train` (its verl trainer) on the experiences a `rftstack
serve` run committed, and writes checkpoints where that serve's synchronizer loads them. Both sides
meet in one directory, Trinity's checkpoint job dir `<checkpoint_root_dir>/<project>/<group>/<name>`:
the serve's experience store (SQLite) is `buffer/experience_buffer.db` there, the trainer writes
`global_step_N/actor` and `latest_state_dict_iteration.txt` there, and the serve's synchronizer polls
that file. So both configs need the same `project`, `group`, `name`, `checkpoint_root_dir` and
`algorithm.algorithm_type`, and `continue_from_checkpoint: true` (otherwise the side that starts
second finds the job dir in use and runs under a new name, Trinity's GlobalConfigValidator).

The algorithm: `reinforceplusplus`. Rewards come one per response through /feedback; REINFORCE++
computes advantages in the trainer from the batch (no critic model, no groups). GRPO would compute
them at /commit on the serve side per `task_id` group, and a group of one response has no
advantage; PPO loads a critic (a second trainable model: memory).

Attention: verl builds the model's HF config with `override_config.attn_implementation`, default
"flash_attention_2" (verl/workers/config/model.py); flash-attn is not in the lock. Trinity's
`build_verl_config` passes `trainer.trainer_config.actor_rollout_ref.model` (or the flat
`trainer.trainer_config.model`) through to verl's `model`, which the actor and the reference model
both read; so without flash-attn the effective config sets `sdpa` there (ATTN_KEY).

Pure functions only: serve's shell (train.py) gathers the facts and passes them in.
"""

from __future__ import annotations

import copy
from typing import Any

from rftstack.run.serve_config import _MISSING, Change, ConfigError, get, job_dir, recorder

ALGORITHM = "reinforceplusplus"
DEFAULT_TRAIN_BATCH_SIZE = 8
DEFAULT_TOTAL_STEPS = 100
DEFAULT_LORA_RANK = 16
ATTN_KEY = "trainer.trainer_config.actor_rollout_ref.model.override_config.attn_implementation"
ATTN_KEY_FLAT = "trainer.trainer_config.model.override_config.attn_implementation"  # Trinity reads both


def store_path(cfg: dict) -> str:
    """The SQLite file of the experience store both sides use (serve's default)."""
    return f"{job_dir(cfg)}/buffer/experience_buffer.db"


def store_config(cfg: dict) -> dict:
    return {"name": "experience_buffer", "storage_type": "sql", "path": f"sqlite:///{store_path(cfg)}"}


def attn_implementation(cfg: dict) -> str | None:
    """The attention the user asked verl's model for (trainer_config), or None (verl: flash_attention_2)."""
    return get(cfg, ATTN_KEY) or get(cfg, ATTN_KEY_FLAT)


def attention_change(cfg: dict, *, flash_attn: bool) -> tuple[str, str] | None:
    """(key, value) the train config needs for the model's attention, or None: `sdpa` when
    flash-attn does not import in the trainer's Python and the user did not choose."""
    if flash_attn or attn_implementation(cfg) is not None:
        return None
    return ATTN_KEY, "sdpa"


def effective(user: dict, *, ray_address: str, flash_attn: bool, gpus: int = 1) -> tuple[dict, list[Change]]:
    """The config `trinity run` gets for a train run, and what changed. ``flash_attn``: whether
    flash_attn imports in the Python that runs the trainer. Raises ConfigError for a config that
    cannot pair with a serve."""
    if not isinstance(user, dict):
        raise ConfigError("the config file is not a YAML mapping; write it as `key: value` lines (see docs/train.md)")
    cfg = copy.deepcopy(user)
    changes: list[Change] = []

    change = recorder(cfg, changes)

    mode = cfg.get("mode")
    if mode not in (None, "train"):
        raise ConfigError(f"the config's mode is {mode!r}, rftstack train runs mode: train; set `mode: train` (or write one with `rftstack example-config MODEL --train`)")
    change("mode", "train", "rftstack train runs trinity's train mode")
    if not get(cfg, "model.model_path"):
        raise ConfigError("the config has no model.model_path; set it to the model directory the serve serves")
    if not cfg.get("checkpoint_root_dir"):
        raise ConfigError(
            "the config has no checkpoint_root_dir; set it to the serve's (the trainer writes checkpoints there and reads "
            "the serve's experiences from there), e.g. with `rftstack example-config MODEL --train --checkpoint-root-dir DIR`"
        )
    tbs = get(cfg, "buffer.train_batch_size")
    if tbs is None or isinstance(tbs, bool) or not isinstance(tbs, int) or tbs <= 0:
        raise ConfigError(f"buffer.train_batch_size is {tbs!r}; set the number of experiences per training step (e.g. {DEFAULT_TRAIN_BATCH_SIZE})")
    if cfg.get("continue_from_checkpoint") is False:
        raise ConfigError(
            "continue_from_checkpoint is false, so Trinity would rename the job directory the serve already uses and the "
            "trainer would read no experiences; set it to true"
        )
    change("continue_from_checkpoint", True, "the serve created the job directory first; without it Trinity runs under a new name")
    change("cluster.ray_address", ray_address, "the Ray head of this train run")
    if get(cfg, "cluster.node_num") is None:
        change("cluster.node_num", 1, "unset, Trinity asks Ray and turns a one-GPU cluster into colocate mode (trainer and a vLLM engine)")
    if get(cfg, "cluster.gpu_per_node") is None:
        change("cluster.gpu_per_node", max(int(gpus), 1), "unset, Trinity asks Ray and turns a one-GPU cluster into colocate mode")
    sync = get(cfg, "synchronizer.sync_method")
    if sync not in (None, "checkpoint"):
        change("synchronizer.sync_method", "checkpoint", "the serve loads new weights from checkpoints (trinity forces this in train mode too)")
    if get(cfg, "trainer.save_interval", _MISSING) is _MISSING or not get(cfg, "trainer.save_interval"):
        change("trainer.save_interval", 1, "the serve loads checkpoints: save one after every step")
    if get(cfg, "buffer.trainer_input.experience_buffer") is None:
        change("buffer.trainer_input.experience_buffer", store_config(cfg), "the serve's experience store (rftstack serve's default)")
    attn = attention_change(cfg, flash_attn=flash_attn)
    if attn:
        change(*attn, "flash-attn does not import here and verl's default is flash_attention_2; PyTorch's sdpa needs nothing more")
    buf = get(cfg, "buffer.trainer_input.experience_buffer")
    if not isinstance(buf, dict) or str(buf.get("storage_type", "")).lower() != "sql":
        raise ConfigError(
            "buffer.trainer_input.experience_buffer is not an SQL store; a train run reads what a serve committed to SQLite, "
            "so remove the key (the serve's default is used) or give the serve's storage_type: sql and path"
        )
    return cfg, changes


def example(
    model: str,
    *,
    checkpoint_root_dir: str,
    project: str,
    name: str,
    max_model_len: int | None = None,
    train_batch_size: int = DEFAULT_TRAIN_BATCH_SIZE,
    total_steps: int = DEFAULT_TOTAL_STEPS,
    lora_rank: int | None = None,
    gpus: int = 1,
) -> dict:
    """The train config that pairs with the serve config of the same ``checkpoint_root_dir``,
    ``project`` and ``name`` (report_config.config with ``algorithm=ALGORITHM``)."""
    model_section: dict[str, Any] = {"model_path": str(model)}
    if max_model_len is not None:
        model_section["max_model_len"] = int(max_model_len)
    if lora_rank:
        model_section["lora_configs"] = [{"name": "rftstack", "lora_rank": int(lora_rank), "lora_alpha": int(lora_rank)}]
    cfg: dict[str, Any] = {
        "mode": "train",
        "project": project,
        "name": name,
        "checkpoint_root_dir": str(checkpoint_root_dir),
        "continue_from_checkpoint": True,
        "model": model_section,
        "algorithm": {"algorithm_type": ALGORITHM, "repeat_times": 1},
        "cluster": {"node_num": 1, "gpu_per_node": gpus},
        "buffer": {"train_batch_size": int(train_batch_size)},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
        "trainer": {"save_interval": 1, "total_steps": int(total_steps)},
    }
    return cfg
