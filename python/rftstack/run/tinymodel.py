"""A tiny random Qwen2 model directory, made on the spot (no hub download).

Two layers, hidden size 64, a byte-level BPE tokenizer trained on a fixed text, and a ChatML chat
template: enough for vLLM and Trinity to load, serve and reload it. Used by the embedded default of
`rftstack serve`, by the tests and by the GPU checks. Deterministic: the same files every time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, TypeVar

from rftstack.errors import UserError

T = TypeVar("T")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MAX_POSITION = 2048
MARKER = ".rftstack-tiny-model"  # written last: a directory without it is incomplete


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = ["hello world this is a tiny model for testing serve mode"] * 50 + [" ".join(chr(c) for c in range(32, 127))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write(outdir: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write the tiny model into ``outdir`` (created; must not hold another model). Returns the path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    outdir = Path(outdir)
    fast = _train_tokenizer()
    fast.save_pretrained(outdir)
    cfg = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITION,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(outdir)
    (outdir / MARKER).write_text(json.dumps({"seed": seed, "generator": "rftstack.tinymodel"}) + "\n")
    return outdir


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / MARKER).is_file()


def ensure(path: str | os.PathLike, *, seed: int = 0) -> Path:
    """The tiny model at ``path``, generated once: built in a temporary sibling, then renamed."""
    path = Path(path)
    if is_complete(path):
        return path
    if path.exists() and any(path.iterdir()):
        raise UserError(f"{path} exists but holds no complete tiny model; remove it or choose another directory")
    build_dir(path, lambda tmp: write(tmp, seed=seed))
    return path


def build_dir(path: Path, build: Callable[[Path], T]) -> T:
    """Run ``build`` on a temporary sibling of ``path`` (absent or empty), then rename it to
    ``path``: a reader never sees a half-written model. Returns what ``build`` returned."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        result = build(tmp)
        tmp.chmod(0o755)
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def configure(parser):
    parser.add_argument("outdir", help="directory to create (must be absent or empty)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    path = ensure(args.outdir, seed=args.seed)
    files = sorted(p.name for p in path.iterdir())
    if args.json:
        print(json.dumps({"path": str(path.resolve()), "files": files}))
    else:
        print(f"tiny model ready at {path.resolve()} ({len(files)} files)")
    return 0
