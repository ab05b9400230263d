"""Train-side preflight (`rftstack train`): what the verl trainer needs before it starts.

- ``trainer-import``: Trinity's verl trainer (trinity.trainer.verl.trainer: verl, torch, ray,
  transformers) imports in a subprocess with the installed numpy (verl 0.8.0 declares numpy<2, the
  lock installs numpy 2.3).
- ``experience-store``: the serve's SQLite store exists and holds the tables the trainer's SQL
  reader reads (``<name>`` with ``consumed``/``model_version``/``reward``, ``<name>_blob``).
- ``gpu-memory``: an ESTIMATE of what the trainer needs against the GPU's free memory (the serve
  runs first and holds its share): full fine-tune with Adam under FSDP mixed precision keeps fp32
  weights, gradients and two Adam moments (16 bytes per parameter) plus a bf16 reference model
  (2 bytes); LoRA keeps the bf16 base (2 bytes, shared with the reference) plus the adapter. Both
  plus a fixed allowance for activations and CUDA context. Trinity's own check looks at total
  memory only.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

from rftstack.findings import FAIL, OK, WARN, Finding

FULL_BYTES_PER_PARAM = 18  # fp32 weights + grads + Adam m, v (16) + bf16 reference (2)
LORA_BYTES_PER_PARAM = 2.2  # bf16 base (shared by the reference) + adapter, grads and Adam (10%)
OVERHEAD_MIB = 3072  # CUDA context, NCCL, activations of a small micro-batch (estimate)
PROBE = (
    "import json, numpy, importlib.metadata as md\n"
    "import trinity.trainer.verl.trainer  # verl, torch, ray, transformers\n"
    "print('RFTSTACK-TRAINER ' + json.dumps({'numpy': numpy.__version__, 'verl': md.version('verl')}))\n"
)


def trainer_import(python: str | None = None, timeout: float = 300) -> tuple[bool, str, dict]:
    """(imported, last lines of its error, versions) of Trinity's verl trainer in a subprocess."""
    out = subprocess.run([python or sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith("RFTSTACK-TRAINER "):
            return True, "", json.loads(line[17:])
    tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
    return False, tail, {}


def check_trainer_import(ok: bool, error: str, versions: dict) -> list[Finding]:
    if ok:
        return [Finding("train.trainer_import", OK, f"Trinity's verl trainer imports (verl {versions.get('verl')}, numpy {versions.get('numpy')}).", "", versions)]
    return [Finding("train.trainer_import", FAIL, f"Trinity's verl trainer (trinity.trainer.verl.trainer) does not import: {error}",
                    "Run `rftstack doctor` and reinstall from the lock (`uv sync --locked && rftstack relax`).")]


def store_tables(db: Path, name: str) -> tuple[bool, list[str]]:
    """(exists, missing table/column names) of the experience store the trainer reads."""
    if not db.is_file():
        return False, []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        missing = [t for t in (name, f"{name}_blob") if t not in tables]
        if name in tables:
            cols = {r[1] for r in con.execute(f'pragma table_info("{name}")')}
            missing += [f"{name}.{c}" for c in ("id", "consumed", "model_version", "reward") if c not in cols]
        return True, missing
    finally:
        con.close()


def check_store(db: Path, name: str, exists: bool, missing: list[str]) -> list[Finding]:
    if not exists:
        return [Finding("train.experience_store", FAIL, f"The experience store {db} does not exist, so the trainer has nothing to read.",
                        "Start `rftstack serve` with the paired config first (same checkpoint_root_dir, project and name), or fix checkpoint_root_dir.")]
    if missing:
        return [Finding("train.experience_store", FAIL, f"The experience store {db} lacks {', '.join(missing)}, which Trinity's SQL reader reads.",
                        "Point buffer.trainer_input.experience_buffer at the store a serve wrote (its `data: experience_buffer` line).")]
    return [Finding("train.experience_store", OK, f"The experience store {db} has the tables the trainer reads.", "")]


def count_params(model_dir: Path) -> int | None:
    """Parameters in the model's safetensors files (read from their headers), or None."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, t in header.items():
            if key != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count
    return total


def need_mib(params: int, lora: bool) -> int:
    per = LORA_BYTES_PER_PARAM if lora else FULL_BYTES_PER_PARAM
    return int(params * per / 2**20) + OVERHEAD_MIB


def check_memory(params: int | None, lora: bool, free_mib: int | None, total_mib: int | None) -> list[Finding]:
    if params is None or free_mib is None:
        what = "no safetensors weights" if params is None else "no GPU free-memory reading"
        return [Finding("train.gpu_memory", WARN, f"The trainer's GPU memory cannot be estimated ({what}).", "Check nvidia-smi while the first step runs.")]
    need = need_mib(params, lora)
    how = "LoRA" if lora else "full fine-tune with Adam"
    data = {"params": params, "lora": lora, "need_mib_estimate": need, "free_mib": free_mib, "total_mib": total_mib}
    text = f"{how} of {params / 1e9:.2f} B parameters needs about {need} MiB (estimate); the GPU has {free_mib} MiB free"
    if need > free_mib:
        fix = ("Lower the serve's explorer.rollout_model.gpu_memory_utilization, or train with LoRA (model.lora_configs; "
               "`rftstack example-config MODEL --train --lora-rank 16`)" if not lora else
               "Lower the serve's explorer.rollout_model.gpu_memory_utilization or use a smaller model")
        return [Finding("train.gpu_memory", FAIL, text + ".", fix + "; --skip-doctor starts anyway.", data)]
    return [Finding("train.gpu_memory", OK, text + ".", "", data)]
