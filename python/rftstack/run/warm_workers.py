"""Warm Ray workers for serve's own head: Trinity's actors start in processes that imported it already.

Trinity's serve creates its actors one after another (the Explorer, then the engine actor, then the
rollout coordinator, with the synchronizer and the experience buffer's writer beside them), and each
new Ray worker process imports torch, vLLM and Trinity first (about 10 s each on the H200 host).
serve's own head is started with

- ``RAY_preload_python_modules``: the modules of those actors, imported by every worker the raylet
  starts, before it takes a task;
- ``RFTSTACK_RAY_PRESTART_WORKERS``: as many idle workers started with the node as the config has
  such actors (patches/ray-prestart-workers.patch; Ray would start one per CPU, each about 1 GB with
  these modules);
- Trinity's variables for the config (``config.get_envs()``: log directory and level, plugin dirs),
  so that actors inherit them from the head.

`trinity run` gets ``RFTSTACK_HEAD_TRINITY_ENV`` (those variables as JSON): when they are exactly
what its config gives, it starts its job without a runtime_env (patches/trinity-launcher-head-env.patch),
and only then does Ray hand it the idle workers; any difference and it falls back to upstream's
runtime_env, with a warning, so a wrong guess here costs time, never correctness.
"""

from __future__ import annotations

import json
import os

from rftstack import dotted
from rftstack.errors import UserError
from rftstack.run import serve_config

PRELOAD = (
    "trinity.explorer.explorer",
    "trinity.explorer.rollout_coordinator",
    "trinity.common.models.vllm_model",
    "trinity.manager.synchronizer",
    "trinity.buffer.storage.sql",
)
HEAD_ENV_VAR = "RFTSTACK_HEAD_TRINITY_ENV"  # read by the launcher patch
PRESTART_VAR = "RFTSTACK_RAY_PRESTART_WORKERS"  # read by the Ray patch
COUNT_VAR = "RFTSTACK_WARM_WORKERS"  # serve's default for --warm-workers
# actors of a serve besides the engines: Explorer, Synchronizer, RolloutCoordinator, the buffer's writer
FIXED_ACTORS = 4


def asked(flag: int | None, environ) -> int | None:
    """The count asked for: ``--warm-workers``, else $RFTSTACK_WARM_WORKERS, else None (one per actor)."""
    if flag is not None:
        if flag < 0:
            raise UserError(f"--warm-workers {flag}: give a number of idle Ray workers, 0 or more (0: none)")
        return flag
    value = environ.get(COUNT_VAR, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise UserError(f"{COUNT_VAR}={value!r}: give a number of idle Ray workers, 0 or more (0: none), or unset it")
    return int(value)


def trinity_env(cfg: dict, *, cwd: str, environ: dict[str, str]) -> dict[str, str]:
    """The variables Trinity's ``config.get_envs()`` gives for ``cfg`` once its config check has run
    with ``cwd`` as the working directory (Trinity 0.6.0: a relative checkpoint_root_dir is joined to
    it; log.save_dir is always <checkpoint_job_dir>/log)."""
    root = cfg.get("checkpoint_root_dir") or ""
    job = serve_config.job_dir({**cfg, "checkpoint_root_dir": os.path.join(cwd, root)})  # an absolute root stays as it is
    return {
        "TRINITY_PLUGIN_DIRS": environ.get("TRINITY_PLUGIN_DIRS", ""),
        "TRINITY_LOG_LEVEL": str(dotted.get(cfg, "log.level") or "INFO"),
        "TRINITY_LOG_DIR": os.path.join(job, "log"),
        "TRINITY_LOG_NODE_IP": "1" if dotted.get(cfg, "log.group_by_node") else "0",
    }


def actor_count(cfg: dict) -> int:
    """Ray actors Trinity's serve creates for ``cfg``: one per rollout and auxiliary engine, plus the
    Explorer, the synchronizer, the rollout coordinator and the experience buffer's writer."""
    engines = int(dotted.get(cfg, "explorer.rollout_model.engine_num") or 1)
    for aux in dotted.get(cfg, "explorer.auxiliary_models") or []:
        engines += int((aux or {}).get("engine_num") or 1)
    return FIXED_ACTORS + engines


def head_env(trinity: dict[str, str], workers: int) -> dict[str, str]:
    """What serve's own head is started with: ``workers`` idle workers importing PRELOAD."""
    return {**trinity, "RAY_preload_python_modules": ",".join(PRELOAD), PRESTART_VAR: str(workers)}


def driver_env(trinity: dict[str, str]) -> dict[str, str]:
    """What `trinity run` is started with: the head's Trinity variables, for the launcher patch."""
    return {HEAD_ENV_VAR: json.dumps(trinity, sort_keys=True)}
