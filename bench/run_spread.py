"""How far one run's Summary figures move from the next: the load figures of several serve_vs_bare.py
runs (the same tree, the same shape), each run's value side by side, their range, and the pooled ratio
(every run's proxy tokens/s summed over every run's bare tokens/s: a run with a fast or slow bare counts
once, as it would in a longer run).

    python bench/run_spread.py bench/results/gpu-X/serve-qwen3b-long.json bench/results/gpu-Y/serve-qwen3b-abba1.json ...
    python bench/run_spread.py --json RUN.json RUN.json ...
    python bench/run_spread.py --each RUN.json:PHASE RUN.json:PHASE ...

--each: one column per run and phase (a switched phase such as trinity-record, or trinity), each against the
bare phase of its own run; a figure a run lacks (no spread levels) is "-"; no range, no pooled value.

Each run needs the `bare` and `trinity` phases with equal lengths at c=32 and c=64 and spread lengths at
c=32 and c=64 (`--spread 0.75 --spread-levels 32,64`). The Summary table (bench/summary_table.py) gives the
pooled value of the runs it is given (and each run's values under it); this is what a reader needs to weigh it
beside other runs: docs/benchmarks.md, "One run against the next".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import summary_table
from summary_table import P99, MissingFigure, p99_ratio

# (figure, phase key, concurrency): the throughput rows, proxy tokens/s over bare's: the Summary's, and c=32 spread
THROUGHPUT = (*summary_table.THROUGHPUT, ("proxy/bare c=32 spread", "load_spread", 32))


def _tok_s(result: dict, phase: str, key: str, c: int, where: str) -> float:
    return float(summary_table._tokens(result, phase, key, c, where))


def spread(runs: list[tuple[str, dict]]) -> dict:
    """{figure: {"runs": [value per run], "min", "max", "pooled"}} (p99 has no pooled value: a
    percentile of several runs cannot be had from each run's percentile)."""
    if len(runs) < 2:
        raise MissingFigure("give two runs or more: one run has no spread")
    out: dict = {}
    for name, key, c in THROUGHPUT:
        proxy = [_tok_s(r, "trinity", key, c, where) for where, r in runs]
        bare = [_tok_s(r, "bare", key, c, where) for where, r in runs]
        values = [p / b for p, b in zip(proxy, bare)]
        out[name] = {"runs": values, "min": min(values), "max": max(values), "pooled": sum(proxy) / sum(bare)}
    p99 = [p99_ratio(r, where) for where, r in runs]
    out[P99] = {"runs": p99, "min": min(p99), "max": max(p99), "pooled": None}
    return out


def column_names(runs: list[tuple[str, dict]]) -> list[str]:
    """Each run's label; a label that more than one run carries (the same host step in two sessions) gets its
    results folder after it, ``gpu-`` left off: ``qwen3b-abba1 (2026-12-04w)``."""
    labels = [r.get("label", "?") for _, r in runs]
    return [f"{label} ({Path(where).parent.name.removeprefix('gpu-')})" if labels.count(label) > 1 else label
            for label, (where, _) in zip(labels, runs)]


def table(runs: list[tuple[str, dict]], figures: dict) -> str:
    head = "| figure | " + " | ".join(column_names(runs)) + " | range | pooled |"
    out = [head, "|---" * (len(runs) + 3) + "|"]
    for name, f in figures.items():
        cells = [f"{v:.2f}" for v in f["runs"]]
        pooled = "-" if f["pooled"] is None else f"{f['pooled']:.2f}"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {f['min']:.2f}-{f['max']:.2f} | {pooled} |")
    out.append("")
    out += [f"- `{where}`: {r.get('label')}, started {r.get('started')}" for where, r in runs]
    return "\n".join(out) + "\n"


def each(entries: list[tuple[str, str, dict]]) -> str:
    """The --each table: (path, phase, result) per column, every figure against that run's bare."""
    head = "| figure | " + " | ".join(f"{r.get('label', '?')} {phase}" for _, phase, r in entries) + " |"
    out = [head, "|---" * (len(entries) + 1) + "|"]

    def cell(fn) -> str:
        try:
            return f"{fn():.2f}"
        except MissingFigure:
            return "-"

    for name, key, c in THROUGHPUT:
        cells = [cell(lambda: _tok_s(r, phase, key, c, where) / _tok_s(r, "bare", key, c, where)) for where, phase, r in entries]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append(f"| {P99} | " + " | ".join(cell(lambda: p99_ratio(r, where, phase)) for where, phase, r in entries) + " |")
    out.append("")
    seen = dict.fromkeys(where for where, _, _ in entries)
    runs = {where: r for where, _, r in entries}
    out += [f"- `{where}`: {runs[where].get('label')}, started {runs[where].get('started')}" for where in seen]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="serve_vs_bare.py results with bare and trinity load runs")
    ap.add_argument("--json", action="store_true", help="the figures as JSON instead of a markdown table")
    ap.add_argument("--each", action="store_true", help="RUNS are RUN.json:PHASE: one column each, against its run's bare")
    args = ap.parse_args(argv)
    if args.each:
        try:
            entries = []
            for spec in args.runs:
                path, sep, phase = spec.rpartition(":")
                if not sep or not phase:
                    raise MissingFigure(f"{spec!r} is not RUN.json:PHASE; name the phase after a colon")
                result = json.loads(Path(path).read_text())
                summary_table._phase(result, phase, path)
                summary_table._phase(result, "bare", path)
                entries.append((path, phase, result))
        except (OSError, json.JSONDecodeError, MissingFigure) as exc:
            print(f"run_spread: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(each(entries))
        return 0
    try:
        runs = [(p, json.loads(Path(p).read_text())) for p in args.runs]
        figures = spread(runs)
    except (OSError, json.JSONDecodeError, MissingFigure) as exc:
        print(f"run_spread: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"runs": [p for p, _ in runs], "figures": figures}, indent=2))
    else:
        sys.stdout.write(table(runs, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
