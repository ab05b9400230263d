"""What the sampled token's logprob (``logprobs: true``, which every experience needs) costs vLLM's *engine* per
step, stage by stage, with vLLM's own code: the part bench/logprobs_cost.py (the API server's share) leaves out.

One engine step of a batch of ``--batch`` decoding requests, all sampled at temperature 1 (as the bench's
requests), vocabulary ``--vocab`` (Qwen2.5's 151936 by default):

  sampler              vLLM's ``Sampler.forward`` on logits of the step (``--device``: cuda on the GPU host, where
                       this is the model-runner thread's kernel launches; cpu here), with ``--logprobs-mode`` (Trinity
                       sets processed_logprobs): no request with logprobs (max_num_logprobs None) against every
                       request asking for the sampled token's (0). CPU ms of the calling thread per step (what the
                       model runner's thread pays) and wall ms per step with the device drained once per run.
  copy to host         the model runner's async output: ``LogprobsTensors.to_cpu_nonblocking()``, the wait for the
                       copy, ``tolists()`` (vLLM's AsyncGPUModelRunnerOutput.get_output)
  scheduler slices     the scheduler's ``LogprobsLists.slice_request`` for every request of the step
                       (Scheduler.update_from_output)
  engine -> frontend   ``MsgpackEncoder.encode`` of the step's ``EngineCoreOutputs`` (the EngineCore's output thread)
                       and ``MsgpackDecoder.decode`` (the API server's output handler), with and without each
                       request's ``new_logprobs``

The logits are random numbers (a TEST DOUBLE of the model's: the sampler's work does not depend on their values);
every function timed is the installed vLLM's.

    python bench/engine_logprobs_cost.py [--device cuda] [--batch 32,64] [--steps 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import loadgen

MODES = ("raw_logprobs", "processed_logprobs")


def sampling_metadata(batch: int, device: str, num_logprobs: int | None):
    """vLLM's SamplingMetadata for ``batch`` requests at temperature 1 (all random, no top-k/p, no penalties)."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    zeros = torch.zeros(batch, device=device)
    return SamplingMetadata(
        temperature=torch.ones(batch, device=device), all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=torch.ones(batch, device=device),
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_sampler(batch: int, vocab: int, device: str, mode: str, num_logprobs: int | None, steps: int) -> dict:
    """Sampler.forward ``steps`` times (after warm-up calls that compile what vLLM compiles): CPU and wall ms per step,
    and, where it returns logprobs, the copy to the host as the model runner makes it."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler(logprobs_mode=mode)
    meta = sampling_metadata(batch, device, num_logprobs)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = [torch.randn(batch, vocab, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    for i in range(10):
        sampler(logits[i % 4].clone(), meta)
    sync(device)
    inputs = [logits[i % 4].clone() for i in range(steps)]  # the sampler works in place on its logits
    sync(device)
    c0, w0 = time.thread_time(), time.perf_counter()
    outs = [sampler(x, meta) for x in inputs]
    c1 = time.thread_time()
    sync(device)
    w1 = time.perf_counter()
    row = {"cpu_ms_per_step": round(1000 * (c1 - c0) / steps, 4), "wall_ms_per_step": round(1000 * (w1 - w0) / steps, 4)}
    if outs[0].logprobs_tensors is not None:
        copies = []
        for out in outs[:min(steps, 100)]:
            t0 = time.thread_time()
            cpu = out.logprobs_tensors.to_cpu_nonblocking()
            event = torch.cuda.Event() if device.startswith("cuda") else None
            if event is not None:
                event.record()
                event.synchronize()
            cpu.tolists()
            copies.append(time.thread_time() - t0)
        row["copy_to_host_cpu_ms_per_step"] = round(1000 * statistics.median(copies), 4)
    return row


def lists_of_step(batch: int, seed: int):
    """The host-side LogprobsLists of one step (what tolists() gives for max_num_logprobs 0)."""
    import numpy as np
    from vllm.v1.outputs import LogprobsLists

    rnd = np.random.default_rng(seed)
    return LogprobsLists(rnd.integers(0, 151936, (batch, 1), dtype=np.int32),
                         -rnd.random((batch, 1), dtype=np.float32) * 3, rnd.integers(1, 50, batch, dtype=np.int64), None)


def time_host_side(batch: int, steps: int) -> dict:
    """Per step: the scheduler's slices, then the step's EngineCoreOutputs encoded and decoded, with and without
    each request's new_logprobs (CPU ms, medians over ``steps``)."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    rows: dict[str, list[float]] = {k: [] for k in ("scheduler slices", "encode plain", "decode plain",
                                                    "encode with logprobs", "decode with logprobs")}
    for s in range(steps + 20):
        lists = lists_of_step(batch, s)
        t0 = time.perf_counter()
        sliced = [lists.slice_request(i, 1) for i in range(batch)]
        t1 = time.perf_counter()
        for name, lp in (("plain", [None] * batch), ("with logprobs", sliced)):
            outs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id=f"chatcmpl-{s}-{i}", new_token_ids=[1000 + i],
                                                               new_logprobs=lp[i]) for i in range(batch)])
            a = time.perf_counter()
            bufs = enc.encode(outs)
            b = time.perf_counter()
            back = dec.decode(bufs)
            c = time.perf_counter()
            assert len(back.outputs) == batch
            if s >= 20:
                rows[f"encode {name}"].append(b - a)
                rows[f"decode {name}"].append(c - b)
        if s >= 20:
            rows["scheduler slices"].append(t1 - t0)
    return {k: round(1000 * statistics.median(v), 4) for k, v in rows.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--batch", default="32,64", help="requests decoding in one step, comma-separated (default 32,64)")
    ap.add_argument("--vocab", type=int, default=151936, help="logits per request (default 151936, Qwen2.5's)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--logprobs-mode", default="processed_logprobs", choices=MODES,
                    help="vLLM's --logprobs-mode (default processed_logprobs, what Trinity's engine sets)")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    try:
        batches = loadgen.parse_levels(args.batch)  # a comma list of positive integers, as --concurrency
    except SystemExit:
        print(f"engine_logprobs_cost: --batch {args.batch!r} is not a list of positive integers; give e.g. --batch 32,64",
              file=sys.stderr)
        return 2
    if args.steps < 1 or args.vocab < 2:
        print("engine_logprobs_cost: --steps must be positive and --vocab at least 2", file=sys.stderr)
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"engine_logprobs_cost: --device {args.device} but torch sees no CUDA device here; run it on the GPU host "
              "or with --device cpu", file=sys.stderr)
        return 2
    from importlib import metadata

    result: dict = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"},
        "vllm": metadata.version("vllm"), "torch": torch.__version__, "command": " ".join([sys.executable, *sys.argv]),
        "vocab": args.vocab, "steps": args.steps, "logprobs_mode": args.logprobs_mode, "batches": {},
    }
    for b in batches:
        plain = time_sampler(b, args.vocab, args.device, args.logprobs_mode, None, args.steps)
        sampled = time_sampler(b, args.vocab, args.device, args.logprobs_mode, 0, args.steps)
        host = time_host_side(b, args.steps)
        added = (sampled["cpu_ms_per_step"] - plain["cpu_ms_per_step"] + sampled["copy_to_host_cpu_ms_per_step"]
                 + host["scheduler slices"] + host["encode with logprobs"] - host["encode plain"]
                 + host["decode with logprobs"] - host["decode plain"])
        result["batches"][str(b)] = {"sampler, no logprobs": plain, "sampler, sampled token's logprob": sampled,
                                     "host side (ms per step)": host, "added_cpu_ms_per_step": round(added, 4)}
        print(f"batch {b}: sampler cpu {plain['cpu_ms_per_step']} -> {sampled['cpu_ms_per_step']} ms/step "
              f"(wall {plain['wall_ms_per_step']} -> {sampled['wall_ms_per_step']}), copy {sampled['copy_to_host_cpu_ms_per_step']}, "
              f"slices {host['scheduler slices']}, encode {host['encode plain']} -> {host['encode with logprobs']}, "
              f"decode {host['decode plain']} -> {host['decode with logprobs']}: +{round(added, 3)} ms CPU per step",
              file=sys.stderr, flush=True)
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
