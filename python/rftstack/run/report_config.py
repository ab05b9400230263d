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
    algorithm: str | None = None,
) -> dict:
    """The report's config on ``model``; each keyword changes exactly the key it names.

    ``explorer`` adds keys to the ``explorer`` section (e.g. ``service_status_check_interval``).
    ``algorithm`` adds ``algorithm: {algorithm_type, repeat_times: 1}`` (the pair of a train config).
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
    if algorithm is not None:
        cfg["algorithm"] = {"algorithm_type": algorithm, "repeat_times": 1}
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
    parser.add_argument("--checkpoint-root-dir", help="where Trinity keeps checkpoints and buffers (default: serve's run directory); "
                        "serve and train meet there, so give both the same")
    parser.add_argument("--train", action="store_true", help="write the train config (rftstack train) that pairs with the serve config "
                        "of the same --checkpoint-root-dir")
    parser.add_argument("--for-training", action="store_true", help="a serve config that pairs with a train config "
                        "(adds the train config's algorithm; needs --checkpoint-root-dir)")
    parser.add_argument("--train-batch-size", type=int, default=8, help="--train: experiences per training step (default 8)")
    parser.add_argument("--total-steps", type=int, default=100, help="--train: training steps before the trainer stops (default 100)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank for both configs (0: full fine-tune, the default); "
                        "LoRA is the single-GPU route for a 3B model on a 48 GB card (docs/train.md)")


def run(args: argparse.Namespace) -> int:
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"{model} has no config.json; pass a local model directory (rftstack tiny-model DIR writes one)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization {args.gpu_memory_utilization} is outside (0, 1]; pass a fraction such as 0.60")
    if (args.train or args.for_training) and not args.checkpoint_root_dir:
        raise UserError("--train and --for-training need --checkpoint-root-dir DIR (serve and train meet there); pass the same DIR to both")
    if args.train and args.for_training:
        raise UserError("--train writes the train config and --for-training the serve config; pass one of them (run the command twice)")
    if args.train_batch_size <= 0 or args.total_steps <= 0 or args.lora_rank < 0:
        raise UserError("--train-batch-size and --total-steps must be positive and --lora-rank at least 0; pass e.g. 8, 100, 16")
    import yaml

    ckpt = str(Path(args.checkpoint_root_dir).absolute()) if args.checkpoint_root_dir else None
    if args.train:
        from rftstack.run import train_config

        cfg = train_config.example(model.resolve(), checkpoint_root_dir=ckpt, project=REPORT_PROJECT, name=REPORT_NAME,
                                   max_model_len=args.max_model_len, train_batch_size=args.train_batch_size,
                                   total_steps=args.total_steps, lora_rank=args.lora_rank or None)  # fmt: skip
        start = "rftstack train -c"
    else:
        cfg = config(model.resolve(), max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                     checkpoint_root_dir=ckpt, algorithm=_train_algorithm() if args.for_training else None)  # fmt: skip
        if args.lora_rank:
            cfg["model"]["lora_configs"] = [{"name": "rftstack", "lora_rank": args.lora_rank, "lora_alpha": args.lora_rank}]
        start = "rftstack serve -c"
    text = yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if args.output.exists():
        raise UserError(f"{args.output} already exists; pass another --output or remove it first")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}; start it with: {start} {args.output}", file=sys.stderr)
    return 0


def _train_algorithm() -> str:
    from rftstack.run import train_config

    return train_config.ALGORITHM
