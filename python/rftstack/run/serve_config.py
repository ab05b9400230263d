"""The effective config of a serve: a pure function of the user's YAML and a few decisions.

`effective(user, ...)` returns the config trinity runs and the list of changes it made, each with
its reason, so the user sees exactly how their file was changed (changes.json in the run directory).
`environment(...)` is the same for trinity's environment variables.

Nothing here touches files, processes or the network; the shell (serve.py) gathers the facts
(free port, model's max length, nvcc on PATH) and passes them in.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import os
from collections.abc import Callable
from typing import Any

from rftstack.dotted import get
from rftstack.dotted import put as _set
from rftstack.errors import UserError

LOOPBACK = "127.0.0.1"
DEFAULT_PROXY_PORT = 8010  # trinity's explorer.proxy_port default
# explorer.service_status_check_interval: the Explorer asks the synchronizer for the latest version
# every interval, the proxy's sync loop checks its engines every half; Trinity's 60 s default put
# new weights in service up to ~90 s after the checkpoint (51 s measured on the H200).
STATUS_CHECK_INTERVAL_S = 2
_MISSING = object()
# read by patches/trinity-explorer-node.patch: the Ray node (its address) where Trinity's explorer,
# and so the proxy, runs; empty: wherever Ray places it (upstream)
EXPLORER_NODE_VAR = "RFTSTACK_EXPLORER_NODE"


@dataclasses.dataclass(frozen=True)
class Change:
    key: str  # dotted path, e.g. "explorer.listen_address"
    old: Any  # None when the key was absent
    new: Any
    why: str

    def render(self) -> str:
        old = "(unset)" if self.old is None else repr(self.old)
        return f"{self.key}: {old} -> {self.new!r}  ({self.why})"


class ConfigError(UserError):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def job_dir(cfg: dict) -> str:
    """trinity's checkpoint_job_dir: <checkpoint_root_dir>/<project>/<group>/<name>."""
    return os.path.join(
        cfg.get("checkpoint_root_dir") or "", cfg.get("project") or "Trinity-RFT", cfg.get("group") or "", cfg.get("name") or "rft"
    )


def recorder(cfg: dict, changes: list[Change]) -> Callable[[str, Any, str], None]:
    """``change(key, new, why)``: set ``key`` in ``cfg`` to ``new`` when it differs, and record the
    Change (for changes.json). Shared by the serve and train configs."""

    def change(key: str, new: Any, why: str) -> None:
        old = get(cfg, key)
        if old != new:
            _set(cfg, key, new)
            changes.append(Change(key, old, new, why))

    return change


def effective(
    user: dict,
    *,
    run_dir: str,
    ray_address: str,
    proxy_port: int,
    expose: bool = False,
    model_max_len: int | None = None,
) -> tuple[dict, list[Change]]:
    """The config `trinity run` gets, and what changed. Raises ConfigError for configs serve cannot run."""
    if not isinstance(user, dict):
        raise ConfigError("the config file is not a YAML mapping; write it as `key: value` lines (see docs/serve.md)")
    cfg = copy.deepcopy(user)
    changes: list[Change] = []

    change = recorder(cfg, changes)

    mode = cfg.get("mode")
    if mode not in (None, "serve"):
        raise ConfigError(f"the config's mode is {mode!r}, rftstack serve runs mode: serve; set `mode: serve` or use `trinity run`")
    change("mode", "serve", "rftstack serve runs trinity's serve mode")
    if not get(cfg, "model.model_path"):
        raise ConfigError("the config has no model.model_path; set it to a local model directory")
    gmu = get(cfg, "explorer.rollout_model.gpu_memory_utilization")
    if gmu is not None and (isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1):
        raise ConfigError(
            f"explorer.rollout_model.gpu_memory_utilization is {gmu!r}, but it is the fraction of each GPU's memory vLLM may use; "
            "set a number above 0 and at most 1 (e.g. 0.6)"
        )
    mml = get(cfg, "model.max_model_len")
    if mml is not None and (isinstance(mml, bool) or not isinstance(mml, int) or mml <= 0):
        raise ConfigError(f"model.max_model_len is {mml!r}; set a positive number of tokens (e.g. 4096) or remove it to use the model's own")
    if mml is not None and model_max_len and mml > model_max_len:
        raise ConfigError(
            f"model.max_model_len {mml} is larger than the model's max_position_embeddings {model_max_len}, which vLLM refuses; "
            f"set it to at most {model_max_len}"
        )

    # --- exposure ---------------------------------------------------------------------------
    listen = get(cfg, "explorer.listen_address")
    if not expose:
        if listen is None:
            change("explorer.listen_address", LOOPBACK, "trinity's default 0.0.0.0 exposes the proxy to the network; pass --expose to allow that")
        elif not is_loopback(str(listen)):
            change("explorer.listen_address", LOOPBACK, f"the config asks for {listen}, but nothing listens outside loopback without --expose")
    elif listen is None:
        change("explorer.listen_address", "0.0.0.0", "--expose: the proxy listens on every interface")
    change("explorer.proxy_port", proxy_port, "the proxy port this serve checked is free")
    change("cluster.ray_address", ray_address, "the Ray head of this serve (loopback, token auth)")

    # --- served weights follow training -----------------------------------------------------
    if get(cfg, "explorer.min_running_model_num", _MISSING) is _MISSING:
        change(
            "explorer.min_running_model_num",
            0,
            "with trinity's default 1 a single engine never reloads a new checkpoint; "
            "with 0 it reloads, and requests wait during a reload",
        )
    if get(cfg, "explorer.service_status_check_interval", _MISSING) is _MISSING:
        change(
            "explorer.service_status_check_interval",
            STATUS_CHECK_INTERVAL_S,
            "with trinity's default 60 s a new checkpoint is served up to 90 s after it is written; "
            "each check is one Ray call that reads a number held in memory (the synchronizer's version, "
            "each engine's version every half interval), so every 2 s keeps the lag to a few seconds",
        )
    sync = get(cfg, "synchronizer.sync_method")
    if sync not in (None, "checkpoint"):
        change("synchronizer.sync_method", "checkpoint", "serve mode loads new weights from checkpoints (trinity forces this too)")
    change("explorer.rollout_model.enable_openai_api", True, "the proxy forwards to each engine's OpenAI server (trinity forces this too)")
    if get(cfg, "model.max_model_len") is None and model_max_len:
        change("model.max_model_len", int(model_max_len), "serve mode needs it; taken from the model's max_position_embeddings")

    # --- where data lives -------------------------------------------------------------------
    if not cfg.get("checkpoint_root_dir"):
        change("checkpoint_root_dir", os.path.join(run_dir, "checkpoints"), "keep checkpoints and buffers under the run directory")
    if get(cfg, "buffer.trainer_input.experience_buffer") is None:
        db = os.path.join(job_dir(cfg), "buffer", "experience_buffer.db")
        change(
            "buffer.trainer_input.experience_buffer",
            {"name": "experience_buffer", "storage_type": "sql", "path": f"sqlite:///{db}"},
            "trinity's default is a Ray queue held in memory (plus an unsynced jsonl copy); "
            "SQLite commits every /commit durably",
        )
    return cfg, changes


def warnings(cfg: dict, *, expose: bool) -> list[str]:
    """Things about the effective config the user must know, which serve does not change."""
    out = []
    buf = get(cfg, "buffer.trainer_input.experience_buffer") or {}
    if isinstance(buf, dict) and str(buf.get("storage_type", "")).lower() == "queue":
        out.append(
            "buffer.trainer_input.experience_buffer is a Ray queue: committed experiences live in Ray's memory "
            "(a jsonl copy is flushed, not fsynced) and are lost with the process; use storage_type: sql"
        )
    if get(cfg, "explorer.min_running_model_num") not in (None, 0):
        engines = get(cfg, "explorer.rollout_model.engine_num", 1)
        if engines is not None and get(cfg, "explorer.min_running_model_num") >= engines:
            out.append(
                "explorer.min_running_model_num >= engine_num: served weights never follow new checkpoints; set it to 0"
            )
    if expose:
        host = get(cfg, "explorer.listen_address")
        port = get(cfg, "explorer.proxy_port")
        out.append(
            f"--expose: the proxy listens on {host}:{port}; anyone who can reach this machine on that port can "
            "generate with the model and write training data (/feedback, /commit) if it has the API key"
        )
    return out


def default_config(model_path: str, *, gpus: int) -> dict:
    """The embedded default: the tiny model, one engine, the probe's working settings."""
    return {
        "mode": "serve",
        "project": "rftstack",
        "name": "tiny-serve",
        "model": {"model_path": model_path, "max_model_len": 2048},
        "cluster": {"node_num": 1, "gpu_per_node": max(gpus, 1)},
        # no listen_address: effective() puts the proxy on loopback, or with --expose on every interface
        "explorer": {"rollout_model": {"engine_num": 1, "enable_openai_api": True, "gpu_memory_utilization": 0.3}},
        "synchronizer": {"sync_method": "checkpoint"},
    }


def loopback_env() -> dict[str, str]:
    """What keeps the sockets of vLLM's engines on loopback. Given to trinity and to serve's own head:
    Ray's workers, and so the engine actors and their EngineCore processes, inherit the head's
    environment, not the driver's."""
    return {
        # vLLM: its torch.distributed rendezvous (uniproc executor: tcp://get_ip():port) and every
        # "host ip" it computes use VLLM_HOST_IP; unset, it is the host's outbound address.
        "VLLM_HOST_IP": LOOPBACK,
        "VLLM_LOOPBACK_IP": LOOPBACK,
        # gloo (vLLM's CPU groups) binds the address of the interface named here; unset, the hostname's.
        "GLOO_SOCKET_IFNAME": "lo",
        # NCCL's bootstrap and socket transport: loopback (one machine; NVLink/P2P/SHM are unaffected).
        "NCCL_SOCKET_IFNAME": "lo",
    }


def environment(
    base: dict[str, str],
    *,
    ray_env: dict[str, str],
    tag: str,
    nvcc: str | None,
    expose: bool = False,
    explorer_node: str | None = None,
) -> tuple[dict[str, str], list[str]]:
    """trinity's environment and one line per decision. ``nvcc``: path of nvcc found, or None.
    ``explorer_node``: the Ray node address of this machine, where Trinity's explorer (the proxy)
    must run (trinity-explorer-node.patch reads EXPLORER_NODE_VAR); a value in ``base`` wins.

    The loopback settings are not tied to --expose: --expose opens the proxy only; Ray, the vLLM
    engines' own servers and the weight-sync rendezvous stay on loopback (one machine).
    """
    env = dict(base)
    notes = []
    env.update(ray_env)
    env.pop("RAY_AUTH_TOKEN", None)
    env["RFTSTACK_TAG"] = tag
    env["PYTHONUNBUFFERED"] = "1"
    env.update(loopback_env())
    notes.append("Ray, vLLM, gloo and NCCL bound to loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, VLLM_HOST_IP, GLOO/NCCL_SOCKET_IFNAME=lo)")
    if explorer_node is not None:
        if EXPLORER_NODE_VAR in base:
            where = f"on node {base[EXPLORER_NODE_VAR]}" if base[EXPLORER_NODE_VAR] else "where Ray places it (upstream)"
            notes.append(f"{EXPLORER_NODE_VAR} from the environment: Trinity's explorer (the proxy) runs {where}")
        else:
            env[EXPLORER_NODE_VAR] = explorer_node
            notes.append(f"{EXPLORER_NODE_VAR}={explorer_node}: Trinity's explorer (the proxy) runs on this machine's Ray node")
    if nvcc is None and "VLLM_USE_FLASHINFER_SAMPLER" not in base:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
        notes.append("VLLM_USE_FLASHINFER_SAMPLER=0: no nvcc on PATH or in CUDA_HOME, FlashInfer's sampler cannot JIT-compile")
    return env, notes
