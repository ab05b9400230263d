"""A random-weight model directory with Qwen2.5-3B's architecture, for serving benchmarks.

Architecture from Qwen/Qwen2.5-3B(-Instruct)'s published config.json: Qwen2ForCausalLM, hidden 2048,
36 layers, 16 attention heads, 2 KV heads (head_dim 128), intermediate 11008, tied word
embeddings, max_position_embeddings 32768, rope_theta 1e6, rms_norm_eps 1e-6, QKV bias.

One deliberate difference: the tokenizer is rftstack's tiny byte-level BPE (no hub download), so
vocab_size is that tokenizer's size instead of 151936. This shrinks the (tied) embedding from
151936 x 2048 = 311.2 M parameters to <vocab> x 2048 (about 1 M), i.e. the model has about 2.77 B
parameters instead of 3.09 B (the transformer body, where decode time goes, is identical; the
LM-head matmul and the sampler work on a 512-wide instead of a 152k-wide vocabulary).

Weights are generated where they will be used, fast: parameter names and shapes come from a
meta-device model (no memory, no init), each tensor is drawn with ``normal_`` on the chosen device
in bf16, moved to the CPU and written to safetensors shards. On an H200 host this takes well under
a minute; on a CPU, use ``--layers`` / ``--hidden`` overrides to make a small model of the same
shape family (the tests do).

    python bench/model_3b.py OUTDIR [--device cuda] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

# Qwen/Qwen2.5-3B-Instruct config.json, the fields that shape the network (see the module doc).
QWEN25_3B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "max_window_layers": 70,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 151936,
}
MARKER = ".rftstack-bench-model"
SHARD_BYTES = 2 * 1024**3


def model_config(vocab_size: int, eos_id: int, pad_id: int, **overrides) -> dict:
    """Qwen2.5-3B's config with the tiny tokenizer's vocabulary (and optional shape overrides)."""
    cfg = dict(QWEN25_3B, vocab_size=vocab_size, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    return cfg


def init_kind(name: str) -> str:
    """How a parameter is initialised: norms to one, biases to zero, matrices from N(0, 0.02)."""
    if name.endswith("norm.weight"):
        return "ones"
    if name.endswith(".bias"):
        return "zeros"
    return "normal"


def shard_plan(sizes: list[tuple[str, int]], limit: int = SHARD_BYTES) -> list[list[str]]:
    """Group tensor names, in order, into shards of at most ``limit`` bytes (a larger tensor alone)."""
    shards: list[list[str]] = []
    cur: list[str] = []
    cur_bytes = 0
    for name, n in sizes:
        if cur and cur_bytes + n > limit:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += n
    if cur:
        shards.append(cur)
    return shards


def parameter_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint's tensors, from a meta-device model (no memory used)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_cfg = Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = Qwen2ForCausalLM(hf_cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)  # tied: save_pretrained stores only the embedding
    return shapes


def write(outdir: Path, *, device: str = "cuda", seed: int = 0, progress=print, **overrides) -> dict:
    import torch
    from safetensors.torch import save_file

    from rftstack.run.tinymodel import _train_tokenizer

    t0 = time.monotonic()
    tok = _train_tokenizer()
    tok.save_pretrained(outdir)
    cfg = model_config(len(tok), tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id, **overrides)
    shapes = parameter_shapes(cfg)
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)
    sizes = [(n, 2 * int(torch.Size(s).numel())) for n, s in shapes.items()]
    plan = shard_plan(sizes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(plan):
        fname = "model.safetensors" if len(plan) == 1 else f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for n in names:
            t = torch.empty(shapes[n], dtype=dtype, device=device)
            kind = init_kind(n)
            if kind == "ones":
                t.fill_(1.0)
            elif kind == "zeros":
                t.zero_()
            else:
                t.normal_(0.0, cfg["initializer_range"], generator=gen)
            tensors[n] = t.cpu()
            weight_map[n] = fname
            total += t.numel()
        save_file(tensors, str(outdir / fname), metadata={"format": "pt"})
        progress(f"[model_3b] wrote {fname} ({len(names)} tensors) at {time.monotonic() - t0:.1f} s")
        del tensors
    if len(plan) > 1:
        index = {"metadata": {"total_size": sum(n for _, n in sizes)}, "weight_map": weight_map}
        (outdir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg_out = dict(cfg, transformers_version=__import__("transformers").__version__)
    (outdir / "config.json").write_text(json.dumps(cfg_out, indent=2) + "\n")
    gen_cfg = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"], "do_sample": False}
    (outdir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    info = {
        "parameters": total,
        "vocab_size": cfg["vocab_size"],
        "embedding_parameters": cfg["vocab_size"] * cfg["hidden_size"],
        "published_embedding_parameters": QWEN25_3B["vocab_size"] * QWEN25_3B["hidden_size"],
        "shards": len(plan),
        "device": device,
        "seed": seed,
        "overrides": {k: v for k, v in overrides.items() if v is not None},
        "seconds": round(time.monotonic() - t0, 2),
    }
    (outdir / MARKER).write_text(json.dumps(info) + "\n")
    return info


def ensure(path: Path, **kw) -> dict:
    """The model at ``path``, written once (into a temporary sibling, then renamed)."""
    if (path / MARKER).is_file():
        return json.loads((path / MARKER).read_text())
    if path.exists() and any(path.iterdir()):
        raise SystemExit(f"model_3b: {path} exists but holds no complete bench model; remove it or pick another directory")
    from rftstack.run.tinymodel import build_dir

    return build_dir(path, lambda tmp: write(tmp, **kw))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--device", default=None, help="where to draw the weights (default: cuda if available, else cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (small test models)")
    ap.add_argument("--hidden", type=int, default=None, help="override hidden_size")
    ap.add_argument("--intermediate", type=int, default=None, help="override intermediate_size")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("model_3b: --device cuda but torch sees no GPU; pass --device cpu (slow for the full size)", file=sys.stderr)
        return 2
    say = (lambda *_: None) if args.json else (lambda m: print(m, flush=True))
    info = ensure(
        Path(args.outdir), device=device, seed=args.seed, progress=say,
        num_hidden_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.intermediate,
    )
    info["path"] = str(Path(args.outdir).resolve())
    print(json.dumps(info) if args.json else f"[model_3b] ready at {info['path']}: {info['parameters'] / 1e9:.2f} B parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
