"""Run Trinity's own config code on a config file, in a subprocess of the doctor.

Usage: python _trinity_probe.py CONFIG GPUS_PER_NODE
Prints one line ``RFTSTACK-PROBE {json}`` with: error (Trinity's exception, if any), changes (what
check_and_update rewrote: key -> [before, after]) and assumed (values the probe had to supply).

Standalone on purpose (imports no rftstack): it runs in the stack's Python and imports trinity,
which imports torch, ray and verl (~15 s). It never starts Ray and leaves no files behind: cluster
sizes Trinity would ask Ray for are supplied, and the job directories Trinity creates go to a
temporary checkpoint root that is mapped back to the real one in the report and then removed.
"""

import json
import os
import shutil
import sys
import tempfile

MARK = "RFTSTACK-PROBE "


def main(path, gpus_per_node):
    result = {"error": None, "error_type": None, "changes": {}, "assumed": {}, "final": {}}
    try:
        from trinity.common.config import load_config
    except Exception as exc:  # trinity not installed or broken
        result.update(error=f"cannot import trinity: {exc}", error_type="ImportError")
        return result
    try:
        cfg = load_config(path)
    except Exception as exc:
        result.update(error=str(exc), error_type=type(exc).__name__, stage="load_config")
        return result
    before = cfg.flatten()
    root = cfg.checkpoint_root_dir or ""
    real_root = root if os.path.isabs(root) else os.path.join(os.getcwd(), root)
    tmp = tempfile.mkdtemp(prefix="rftstack-doctor-")
    result["tmp_root"], result["real_root"] = tmp, real_root.rstrip("/")
    cfg.checkpoint_root_dir = tmp
    if not cfg.cluster.node_num or not cfg.cluster.gpu_per_node:
        # Trinity would ray.init() to count them; the doctor starts nothing
        result["assumed"] = {"cluster.node_num": cfg.cluster.node_num or 1, "cluster.gpu_per_node": cfg.cluster.gpu_per_node or gpus_per_node}
        cfg.cluster.node_num = cfg.cluster.node_num or 1
        cfg.cluster.gpu_per_node = cfg.cluster.gpu_per_node or gpus_per_node
    try:
        cfg.check_and_update()
    except Exception as exc:
        result.update(error=str(exc), error_type=type(exc).__name__, stage="check_and_update")
    finally:
        after = cfg.flatten()
        shutil.rmtree(tmp, ignore_errors=True)

    def unmap(v):
        if isinstance(v, str) and tmp in v:
            return v.replace(tmp, real_root.rstrip("/"))
        return v

    for k, v in after.items():
        if k == "checkpoint_root_dir":
            v = real_root
        v = unmap(v)
        b = unmap(before.get(k))
        if k in before and b != v:
            result["changes"][k] = [b, v]
    keep = ("mode", "synchronizer.sync_method", "explorer.rollout_model.enable_openai_api", "explorer.rollout_model.engine_num",
            "explorer.min_running_model_num", "explorer.proxy_port", "explorer.listen_address", "model.max_model_len",
            "checkpoint_job_dir", "explorer.db_url", "buffer.cache_dir")
    result["final"] = {k: unmap(after.get(k)) for k in keep if k in after}
    result["envs"] = {k: unmap(v) for k, v in cfg.get_envs().items()}  # what `trinity run` gives its actors
    return result


if __name__ == "__main__":
    out = main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    sys.stdout.flush()
    print(MARK + json.dumps(out, default=str), flush=True)
