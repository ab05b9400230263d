"""The serve config of the user report (docs/problems.md), as one function.

This is the shape rftstack is built for: `mode: serve`, a local model directory, one vLLM engine
with the OpenAI API on, `gpu_memory_utilization: 0.60`, and `sync_method: nccl` written in the file
(serve mode loads weights from checkpoints; `rftstack serve` records that change). Tests, the
benchmarks and `rftstack example-config` all write it through here, so there is one copy.

    rftstack example-config /models/Qwen2.5-3B-Instruct --max-model-len 4096 -o qwen3b.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rftstack.errors import UserError

REPORT_PROJECT = "report"
REPORT_NAME = "qwen3b"


def config(
    model: str | Path,
    *,
    max_model_len: int | None = None,
    checkpoint_root_dir: str | Path | None = None,
    temperature: float | None = None,
    project: str | None = REPORT_PROJECT,
    name: str | None = REPORT_NAME,
    gpu_memory_utilization: float = 0.60,
    sync_method: str = "nccl",
    explorer: dict | None = None,
) -> dict:
    """The report's config on ``model``; each keyword changes exactly the key it names.

    ``explorer`` adds keys to the ``explorer`` section (e.g. ``service_status_check_interval``).
    """
    model_section: dict = {"model_path": str(model)}
    if max_model_len is not None:
        model_section["max_model_len"] = int(max_model_len)
    if temperature is not None:
        model_section["temperature"] = float(temperature)
    cfg: dict = {"mode": "serve"}
    if project is not None:
        cfg["project"] = project
    if name is not None:
        cfg["name"] = name
    if checkpoint_root_dir is not None:
        cfg["checkpoint_root_dir"] = str(checkpoint_root_dir)
    cfg["model"] = model_section
    cfg["cluster"] = {"node_num": 1, "gpu_per_node": 1}
    cfg["explorer"] = {
        **(explorer or {}),
        "rollout_model": {"engine_num": 1, "enable_openai_api": True, "gpu_memory_utilization": gpu_memory_utilization},
    }
    cfg["synchronizer"] = {"sync_method": sync_method}
    return cfg


def render(model: str | Path, **kw) -> str:
    """The config as YAML text, keys in the report's order."""
    import yaml

    return yaml.safe_dump(config(model, **kw), sort_keys=False, default_flow_style=False)


def write(path: str | Path, model: str | Path, **kw) -> Path:
    """Write the config to ``path`` (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(model, **kw))
    return path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a local model directory (config.json, tokenizer, weights)")
    parser.add_argument("-o", "--output", type=Path, help="write the config here (default: stdout); an existing file is kept")
    parser.add_argument("--max-model-len", type=int, help="context length to serve (vLLM needs it when the model's is large)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.60, help="share of GPU memory for vLLM (default 0.60)")
    parser.add_argument("--checkpoint-root-dir", help="where Trinity keeps checkpoints and buffers (default: serve's run directory)")


def run(args: argparse.Namespace) -> int:
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"{model} has no config.json; pass a local model directory (rftstack tiny-model DIR writes one)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {args.gpu_memory_utilization} is outside (0, 1]; pass a fraction such as 0.60")
    kw = dict(max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
              checkpoint_root_dir=args.checkpoint_root_dir)
    if args.output is None:
        sys.stdout.write(render(model.resolve(), **kw))
        return 0
    if args.output.exists():
        raise UserError(f"{args.output} already exists; pass another --output or remove it first")
    write(args.output, model.resolve(), **kw)
    print(f"wrote {args.output}; start it with: rftstack serve -c {args.output}", file=sys.stderr)
    return 0
