"""Small helpers for the GPU tests: is there a GPU, its memory and processes, a JSON POST; a
report-shaped `rftstack serve` on the tiny model, its stores and its processes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

from helpers import ServeRun, rftstack_env


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return out.returncode == 0 and any(l.startswith("GPU ") for l in out.stdout.splitlines())


def gpu_memory_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True)
    return sum(int(x) for x in out.stdout.split())


def memory_back_after(baseline_mib: int, limit_s: float, slack_mib: int = 512) -> float | None:
    """Seconds until the GPU's used memory is back within ``slack_mib`` of ``baseline_mib``
    (checked once a second for ``limit_s``, then once more); None if it never was."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and gpu_memory_used_mib() > baseline_mib + slack_mib:
        time.sleep(1)
    return time.monotonic() - t0 if gpu_memory_used_mib() <= baseline_mib + slack_mib else None


def gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True)
    return {int(x) for x in out.stdout.split() if x.strip().isdigit()}


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def start(tmp: Path, name: str, *extra: str, project: str = "rel", **cfg) -> ServeRun:
    """`rftstack serve --json` of the report's config on the tiny model (made once under ``tmp``);
    ``cfg``: more keywords of report_config.config (e.g. ``explorer={"db_url": ...}``)."""
    from rftstack.run import report_config
    from rftstack.run import tinymodel

    model = tinymodel.ensure(tmp / "cache" / "rftstack" / "tiny-model")
    path = report_config.write(tmp / f"{name}.yaml", model, max_model_len=2048, project=project, name=name, **cfg)
    env = rftstack_env(XDG_CACHE_HOME=str(tmp / "cache"))
    return ServeRun(["-c", str(path), "--num-gpus", "1", *extra], env, tmp, tmp / f"run-{name}")


def cmdline(pid: int) -> str:
    """A process's command line (first 80 characters), or "?" when it is gone or not visible here."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "?"


def assert_all_stopped(run: ServeRun, tags: list[str], baseline_mib: int) -> float:
    """No process of the run left, none on the GPU, GPU memory back; returns seconds until it was."""
    from rftstack.run import supervisor

    left = {tag: [(p.pid, p.cmdline[:80]) for p in supervisor.tagged(tag)] for tag in tags}
    on_gpu = {pid: cmdline(pid) for pid in gpu_pids()}
    print(f"tagged processes left: {left}; processes on the GPU: {on_gpu}")
    assert all(v == [] for v in left.values()), left
    freed_after = memory_back_after(baseline_mib, 60)
    print(f"GPU memory back to the baseline {baseline_mib} MiB after {freed_after} s (now {gpu_memory_used_mib()} MiB)")
    assert freed_after is not None
    return freed_after


def experience_rows(db: str) -> list[tuple[str, float]]:
    """(msg_id, reward) of every row of Trinity's SQL experience buffer (the committed experiences)."""
    con = sqlite3.connect(db)
    try:
        return list(con.execute("select msg_id, reward from experience_buffer"))
    finally:
        con.close()



def write_trainer_checkpoint(model_dir: Path, job_dir: Path, step: int = 1) -> None:
    """A checkpoint of ``model_dir``'s weights, each matrix moved by seeded noise, written under
    ``job_dir`` as the trainer writes it (global_step_N/actor, then latest_state_dict_iteration.txt
    replaced atomically), so the serve's synchronizer loads it as version ``step``."""
    import torch
    from safetensors.torch import load_file, save_file

    sd = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(step)
    new = {k: (v.float() + 0.5 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.dim() == 2 else v for k, v in sd.items()}
    actor = job_dir / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    save_file(new, str(actor / "model.safetensors"))
    (job_dir / ".iteration.tmp").write_text(str(step))
    os.replace(job_dir / ".iteration.tmp", job_dir / "latest_state_dict_iteration.txt")
