"""Shared fixtures: real inputs (a tiny model made on the spot, the report's config), no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON_DIR = REPO / "python"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A real tiny Qwen2 model directory (rftstack.tinymodel), made once per test session."""
    from rftstack import tinymodel

    return tinymodel.ensure(tmp_path_factory.mktemp("models") / "tiny")


REPORT_CONFIG = """\
mode: serve
project: report
name: qwen3b
checkpoint_root_dir: {ckpt}
model:
  model_path: {model}
{extra_model}cluster:
  node_num: 1
  gpu_per_node: 1
explorer:
  rollout_model:
    engine_num: 1
    enable_openai_api: true
    gpu_memory_utilization: 0.60
synchronizer:
  sync_method: nccl
"""


def write_report_config(path: Path, model: Path, *, max_model_len: int | None = 2048) -> Path:
    """The config of the user report (mode serve, sync_method nccl, engine_num 1, 0.60), on ``model``."""
    extra = f"  max_model_len: {max_model_len}\n" if max_model_len else ""
    path.write_text(REPORT_CONFIG.format(ckpt=path.parent / "ckpt", model=model, extra_model=extra))
    return path


@pytest.fixture
def report_config(tmp_path, tiny_model) -> Path:
    return write_report_config(tmp_path / "qwen3b.yaml", tiny_model)


def run_python(code: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (heavy imports stay out of pytest)."""
    full_env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env,
    )


def run_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `rftstack ARGS` as a user would, in a subprocess."""
    full_env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rftstack", *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )
