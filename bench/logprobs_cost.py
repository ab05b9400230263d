"""What the fields Trinity's proxy adds to every request (``logprobs``, ``return_token_ids``) cost vLLM's API
server per response, on this CPU: vLLM's own code for one non-streamed chat answer, timed stage by stage.

Per response of ``--tokens`` generated tokens (seeded random ids of the tokenizer's vocabulary, a
``--prompt-tokens`` prompt):

  output processor   vLLM's ``LogprobsProcessor`` (what AsyncLLM's output handler runs for each engine step
                     of the request: the sampled token's logprob, its detokenized string, its rank), one
                     update per token as the engine sends them
  chat logprobs      ``OpenAIServingChat._create_chat_logprobs`` (one ``ChatCompletionLogProbsContent`` per
                     token: the string, its UTF-8 bytes, the logprob)
  (the same with ``FlatLogprobs``, ``SamplingParams.flat_logprobs``: a variant the OpenAI server never selects)
  (the same with numeric logprobs, patches/vllm-logprobs-numeric.patch: one float per token, no chat logprobs,
   the floats as the choice's "rftstack_logprobs"; only when the installed vLLM carries that patch)
  response           ``ChatCompletionResponse(...).model_dump()`` then ``json.dumps`` (what vLLM's route returns
                     through starlette's ``JSONResponse``), with the logprobs and token ids, and plain

No GPU and no engine: the token ids and logprobs stand in for the engine's (a TEST DOUBLE of its output); the
code timed is the installed vLLM's. The tokenizer is the one the GPU benchmark model uses (``rftstack
tiny-model``'s byte-level BPE; ``--tokenizer DIR`` for another).

    python bench/logprobs_cost.py [--responses 300] [--tokens 64] [--out bench/results/logprobs-cost-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))


def tokenizer_dir(given: str | None, tmp: Path) -> Path:
    """``given``, or the bench model's tokenizer (rftstack tiny-model) written under ``tmp``."""
    if given:
        return Path(given)
    from rftstack.run import tinymodel

    return tinymodel.write(tmp / "tiny")


def engine_output(vocab: int, tokens: int, seed: int) -> tuple[list[int], list[float]]:
    """A TEST DOUBLE of the engine's output for one request: sampled token ids and their logprobs."""
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(tokens)], [-rnd.random() * 3 for _ in range(tokens)]


def serving_chat():
    """An OpenAIServingChat with just what _create_chat_logprobs reads (its construction needs an engine)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

    chat = object.__new__(OpenAIServingChat)
    chat.return_tokens_as_token_ids = False
    return chat


def numeric_logprobs_class():
    """patches/vllm-logprobs-numeric.patch's NumericLogprobs, or None when the installed vLLM lacks it."""
    from vllm.v1.engine import logprobs

    return getattr(logprobs, "NumericLogprobs", None)


def one_response(tokenizer, chat, prompt: list[int], ids: list[int], lps: list[float], fields: bool,
                 flat: bool = False, numeric: bool = False) -> dict[str, float]:
    """Seconds per stage for one response (``fields``: with logprobs and token ids, as the proxy asks;
    ``flat``: the output processor keeps them in vLLM's ``FlatLogprobs``, ``SamplingParams.flat_logprobs``,
    which the OpenAI server does not set)."""
    import numpy as np
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )
    from vllm.entrypoints.openai.engine.protocol import UsageInfo
    from vllm.logprobs import create_sample_logprobs
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsLists

    t: dict[str, float] = {}
    text = tokenizer.decode(ids)
    logprobs = None
    numbers = None
    if numeric:  # the patched processor's path (tokenizer None: nothing decoded), no chat logprobs
        t0 = time.perf_counter()
        proc = LogprobsProcessor(tokenizer=None, logprobs=numeric_logprobs_class()(), prompt_logprobs=None,
                                 cumulative_logprob=0.0, num_logprobs=0, num_prompt_logprobs=None)
        for tok, lp in zip(ids, lps):
            proc._update_sample_logprobs(LogprobsLists(np.array([[tok]]), np.array([[lp]], dtype=np.float32),
                                                       np.array([1]), None))
        numbers = list(proc.logprobs)
        t["output processor"] = time.perf_counter() - t0
    elif fields:
        t0 = time.perf_counter()
        proc = LogprobsProcessor(tokenizer=tokenizer, logprobs=create_sample_logprobs(flat), prompt_logprobs=None, cumulative_logprob=0.0,
                                 num_logprobs=0, num_prompt_logprobs=None)
        for tok, lp in zip(ids, lps):
            proc._update_sample_logprobs(LogprobsLists(np.array([[tok]]), np.array([[lp]], dtype=np.float32),
                                                       np.array([1]), None))
        t["output processor"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        logprobs = chat._create_chat_logprobs(token_ids=ids, top_logprobs=proc.logprobs, tokenizer=tokenizer,
                                              num_output_top_logprobs=0, return_as_token_id=None)
        t["chat logprobs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    choice = ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content=text),
                                          logprobs=logprobs, finish_reason="length",
                                          token_ids=list(ids) if fields else None)
    if numbers is not None:
        choice.rftstack_logprobs = numbers  # as the patched route sets it
    resp = ChatCompletionResponse(model="m", choices=[choice], prompt_token_ids=list(prompt) if fields else None,
                                  usage=UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(ids),
                                                  total_tokens=len(prompt) + len(ids)))
    body = json.dumps(resp.model_dump(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    t["response (model_dump + json)"] = time.perf_counter() - t0
    t["bytes"] = len(body)
    return t


def measure(tokenizer, responses: int, tokens: int, prompt_tokens: int, fields: bool, flat: bool = False,
            numeric: bool = False) -> dict:
    chat = serving_chat()
    vocab = len(tokenizer)
    prompt = engine_output(vocab, prompt_tokens, 0)[0]
    rows = [one_response(tokenizer, chat, prompt, *engine_output(vocab, tokens, i + 1), fields=fields, flat=flat, numeric=numeric)
            for i in range(responses + 20)][20:]  # the first 20 warm caches up, not counted
    stages = [k for k in rows[0] if k != "bytes"]
    out = {k: round(1000 * statistics.median(r[k] for r in rows), 4) for k in stages}
    out["total"] = round(sum(out[k] for k in stages), 4)
    out["response_bytes"] = int(statistics.median(r["bytes"] for r in rows))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per response (default 64, the GPU bench's)")
    ap.add_argument("--prompt-tokens", type=int, default=150)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: rftstack tiny-model's)")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    if args.responses < 1 or args.tokens < 1 or args.prompt_tokens < 1:
        print("logprobs_cost: --responses, --tokens and --prompt-tokens must be positive", file=sys.stderr)
        return 2
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        print(f"logprobs_cost: --tokenizer {args.tokenizer} is not a directory; give a model or tokenizer directory",
              file=sys.stderr)
        return 2
    from vllm.tokenizers import get_tokenizer

    with tempfile.TemporaryDirectory(prefix="logprobs-cost-") as tmp:
        tokenizer = get_tokenizer(str(tokenizer_dir(args.tokenizer, Path(tmp))))
    plain = measure(tokenizer, args.responses, args.tokens, args.prompt_tokens, fields=False)
    fields = measure(tokenizer, args.responses, args.tokens, args.prompt_tokens, fields=True)
    flat = measure(tokenizer, args.responses, args.tokens, args.prompt_tokens, fields=True, flat=True)
    numeric = (measure(tokenizer, args.responses, args.tokens, args.prompt_tokens, fields=True, numeric=True)
               if numeric_logprobs_class() else None)
    from importlib import metadata

    result = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "vllm": metadata.version("vllm"), "command": " ".join([sys.executable, *sys.argv]),
        "tokenizer": "rftstack tiny-model" if not args.tokenizer else str(args.tokenizer), "vocab": len(tokenizer),
        "tokens": args.tokens, "prompt_tokens": args.prompt_tokens, "responses": args.responses,
        "ms_per_response_median": {"plain": plain, "with the proxy's fields": fields,
                                   "with the proxy's fields, FlatLogprobs": flat},
        "added_ms_per_response": round(fields["total"] - plain["total"], 4),
    }
    if numeric:
        result["ms_per_response_median"]["with the proxy's fields, numeric logprobs"] = numeric
        result["added_ms_per_response_numeric"] = round(numeric["total"] - plain["total"], 4)
    else:
        result["numeric logprobs"] = "not measured: the installed vLLM lacks patches/vllm-logprobs-numeric.patch"
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
