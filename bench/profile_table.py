"""serve_profile.py's result files as one Markdown table: every server in the order it ran, every window's
responses/s at each level, and the CPU the hypervisor took meanwhile (steal, in cores).

    python bench/profile_table.py RESULT.json [RESULT.json ...] \\
        [--name "--max-num-seqs 256 ...=bare with Trinity's engine arguments"]

A row is one server and one kind of request: through the proxy, straight to Trinity's engine with the proxy's
fields (JSON or numeric logprobs), or bare `vllm serve` plain and with those fields. docs/benchmarks.md's
tables of serve_profile runs are this script's output, and a test checks them against the files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WINDOWS = {  # a window's key in a level -> what was sent, and where
    "proxy": "through the proxy",
    "engine": "its engine directly, the proxy's fields (JSON logprobs)",
    "engine_numeric": "its engine directly, the fields with numeric logprobs",
    "bare": "plain",
    "bare_like_proxy": "the proxy's fields (JSON logprobs)",
    "bare_like_proxy_numeric": "the fields with numeric logprobs",
}


def servers(result: dict, names: dict[str, str]) -> list[tuple[str, dict]]:
    """(label, phase) of each server of one result file, in the order they ran: the serve, bare as it comes,
    then the variants (round 2 and later keep their " #N")."""
    out = []
    serve = result.get("serve")
    if serve and serve.get("levels"):
        args = serve.get("engine_args") or {}
        out.append(("`rftstack serve`" + (f", engine {json.dumps(args, sort_keys=True)}" if args else ""), serve))
    if result.get("bare", {}).get("levels"):
        out.append(("bare `vllm serve`", result["bare"]))
    for key, phase in result.get("bare_variants", {}).items():
        if not phase.get("levels"):
            continue
        variant, _, round_no = key.partition(" #")
        label = "bare `vllm serve`" if variant == "default" else names.get(variant, f"bare `vllm serve {variant}`")
        out.append((label + (f" #{round_no}" if round_no else ""), phase))
    return out


def table(paths: list[Path], names: dict[str, str] | None = None) -> str:
    """The Markdown table of ``paths`` (serve_profile.py results), runs numbered in the given order."""
    names = names or {}
    results = [json.loads(p.read_text()) for p in paths]
    levels = sorted({int(c) for r in results for _, ph in servers(r, names) for c in ph["levels"]})
    head = " | ".join(f"c={c} resp/s" for c in levels)
    steal = " / ".join(f"c={c}" for c in levels)
    lines = [f"| run | server | request | {head} | steal, cores ({steal}) |",
             "|" + "---|" * (4 + len(levels))]
    for i, result in enumerate(results, 1):
        for label, phase in servers(result, names):
            for key, what in WINDOWS.items():
                ws = [phase["levels"].get(str(c), {}).get(key) for c in levels]
                if not any(ws):
                    continue
                rates = " | ".join(f"{w['responses_per_s']:.1f}" if w else "-" for w in ws)
                stolen = " / ".join(f"{w['machine']['steal_cores']:.2f}" if w and "machine" in w else "-" for w in ws)
                lines.append(f"| {i} | {label} | {what} | {rates} | {stolen} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--name", action="append", default=[], metavar="VARIANT=LABEL",
                    help="a bare variant's arguments and the label to print for them (repeatable)")
    args = ap.parse_args(argv)
    names = {}
    for item in args.name:
        variant, sep, label = item.rpartition("=")
        if not sep or not variant or not label:
            print(f"profile_table: --name {item!r} should be VARIANT=LABEL", file=sys.stderr)
            return 2
        names[variant] = label
    missing = [str(p) for p in args.results if not p.is_file()]
    if missing:
        print(f"profile_table: no result file at {missing[0]}; give serve_profile.py's --out files", file=sys.stderr)
        return 2
    print(table(args.results, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
