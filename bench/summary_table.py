"""The Summary table at the top of docs/benchmarks.md, computed from serve_vs_bare.py results.

One row per figure, in the form a script reads (`| name | value |`), then the runs each comes from:

    python bench/summary_table.py --load bench/results/gpu-X/serve-qwen3b-abba1.json \\
        --load bench/results/gpu-X/serve-qwen3b-abba2.json --ready bench/results/gpu-X/serve-qwen3b-warm.json
    python bench/summary_table.py --load ... --ready ... --update docs/benchmarks.md

--load: a run with the `bare` and `trinity` phases, equal lengths at c=32 and c=64 and spread
lengths at c=64 (`--spread 0.75 --spread-levels 32,64`). Given more than once (the long run in
both orders, host step proxy3b-abba), each throughput figure is pooled over the runs (the proxy's
tokens/s summed over them against bare's, as bench/run_spread.py pools), the p99 figure is the
highest of the runs' (a percentile does not pool), and a line under the table gives each run's
value. --ready: a `--ready-only` run with `bare` and `trinity` on warm caches. --update rewrites
the table and the runs under it in the `## Summary` section (up to the next heading) of that
file, and nothing else: the text before the table stays.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import serve_vs_bare  # bench/: the one reader of a phase's compile-cache records

HEADING = "## Summary"
TABLE_HEAD = "| figure | value |"


class MissingFigure(ValueError):
    """A result file lacks a phase or a level the table needs."""


def _level(phase: dict, key: str, concurrency: int, where: str) -> dict:
    for level in (phase.get(key) or {}).get("levels", []):
        if level.get("concurrency") == concurrency:
            if not level.get("ok") or level.get("errors"):
                raise MissingFigure(f"{where}: c={concurrency} in {key} had errors ({level.get('errors')}); rerun it")
            return level
    raise MissingFigure(f"{where} has no c={concurrency} level in {key}; run serve_vs_bare.py with that concurrency")


def _phase(result: dict, name: str, where: str) -> dict:
    phase = result.get("phases", {}).get(name)
    if not phase:
        raise MissingFigure(f"{where} has no '{name}' phase; run serve_vs_bare.py with --phases bare,trinity")
    return phase


def _tokens(result: dict, phase: str, key: str, concurrency: int, where: str) -> float:
    return _level(_phase(result, phase, where), key, concurrency, where)["output_tokens_per_s"]


def _pooled(loads: Sequence[dict], names: Sequence[str], key: str, concurrency: int) -> float:
    """The proxy's output tokens/s summed over the runs against bare's (one run: its own ratio)."""
    runs = list(zip(loads, names, strict=True))
    return sum(_tokens(r, "trinity", key, concurrency, n) for r, n in runs) / sum(
        _tokens(r, "bare", key, concurrency, n) for r, n in runs)


def p99_ratio(result: dict, where: str, phase: str = "trinity") -> float:
    """The proxy's (``phase``'s) p99 latency over bare's, equal lengths at c=32."""
    bare = _level(_phase(result, "bare", where), "load", 32, where)["latency_s"]["p99"]
    proxy = _level(_phase(result, phase, where), "load", 32, where)["latency_s"]["p99"]
    return proxy / bare


THROUGHPUT = (("proxy/bare c=64 equal", "load", 64), ("proxy/bare c=64 spread", "load_spread", 64),
              ("proxy/bare c=32 equal", "load", 32))
P99 = "p99 proxy/bare c=32"


def per_run(loads: Sequence[dict], names: Sequence[str]) -> dict[str, list[float]]:
    """{figure: [its value in each load run]}, the table's throughput and p99 rows."""
    out = {name: [_pooled([r], [n], key, c) for r, n in zip(loads, names, strict=True)] for name, key, c in THROUGHPUT}
    out[P99] = [p99_ratio(r, n) for r, n in zip(loads, names, strict=True)]
    return out


def figures(loads: Sequence[dict], ready: dict, load_names: Sequence[str], ready_name: str) -> list[tuple[str, str, str]]:
    """(figure, value as printed, source) rows, in the order the table lists them; the load figures pooled over
    ``loads`` (p99: the highest run's), the source of a pooled row its runs' names joined by " + "."""
    if not loads or len(loads) != len(load_names):
        raise MissingFigure("give one --load result or more, each with its name")
    ready_s = {name: (_phase(ready, name, ready_name).get("ready") or {}).get("models_s") for name in ("bare", "trinity")}
    if not all(ready_s.values()):
        raise MissingFigure(f"{ready_name}: a phase never became ready ({ready_s}); rerun it")
    for name in ("bare", "trinity"):
        if compiled := serve_vs_bare.compiled_before_ready(_phase(ready, name, ready_name)):
            raise MissingFigure(
                f"{ready_name}: its {name} phase compiled the model before it was ready ({compiled} new files in "
                f"vLLM's compile cache), so its time to ready is not a warm one; rerun the --ready-only run after "
                f"a run that started the model in both servers")
    source = " + ".join(load_names)
    rows = [(name, f"{_pooled(loads, load_names, key, c):.2f}", source) for name, key, c in THROUGHPUT]
    rows.append((P99, f"{max(p99_ratio(r, n) for r, n in zip(loads, load_names, strict=True)):.2f}", source))
    rows.append(("ready/bare warm", f"{ready_s['trinity'] / ready_s['bare']:.2f}", ready_name))
    return rows


def steal_note(result: dict) -> str:
    """The most CPU the hypervisor took in any load level of bare and of the proxy, where the run's levels say
    (bench/loadgen.py records it since session V; earlier runs: ""), so a figure can be weighed with it."""
    worst: dict[str, float] = {}
    for name in ("bare", "trinity"):
        for key in ("load", "load_spread"):
            for level in ((result.get("phases", {}).get(name) or {}).get(key) or {}).get("levels", []):
                if "machine" in level:
                    worst[name] = max(worst.get(name, 0.0), level["machine"]["steal_cores"])
    if not worst:
        return ""
    return "; steal, the most in a level: " + ", ".join(f"{name} {value:.2f} cores" for name, value in worst.items())


def table(rows: list[tuple[str, str, str]], loads: Sequence[dict], load_names: Sequence[str], ready: dict,
          ready_name: str) -> str:
    """The table, a line with each load run's values where there are several, then one line per run it comes
    from (the load runs, then the ready run)."""
    out = [TABLE_HEAD, "|---|---|"]
    out += [f"| {name} | {value} |" for name, value, _ in rows]
    out.append("")
    if len(loads) > 1:
        values = per_run(loads, load_names)
        parts = [f"{name} " + ", ".join(f"{v:.2f}" for v in values[name]) for name in values]
        out.append(f"Pooled over {len(loads)} load runs (throughput: the proxy's tokens/s summed over the runs "
                   f"against bare's; p99: the highest run's); each run, in the order listed: " + "; ".join(parts) + ".")
        out.append("")
    for source, result in [*zip(load_names, loads, strict=True), (ready_name, ready)]:
        note = steal_note(result) if result is not ready else ""
        out.append(f"- `{source}`: {result.get('label')}, started {result.get('started')}, `{result.get('command')}`{note}")
    return "\n".join(out) + "\n"


def update(doc: Path, text: str) -> None:
    """Replace the table and its sources under `## Summary` (up to the next `## ` heading) in doc with
    text; what the section says before its table stays."""
    src = doc.read_text()
    m = re.search(rf"^{re.escape(HEADING)}[^\n]*\n(.*?)(?=^## )", src, flags=re.S | re.M)
    if not m:
        raise MissingFigure(f"{doc} has no '{HEADING}' section followed by another '## ' heading; add one")
    body = m.group(1)
    start = body.find(TABLE_HEAD)
    intro = body[:start] if start >= 0 else "\n"
    doc.write_text(src[: m.start(1)] + intro + text + "\n" + src[m.end(1) :])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", required=True, action="append",
                    help="serve_vs_bare.py result with load runs (bare, trinity); more than once to pool runs")
    ap.add_argument("--ready", required=True, help="serve_vs_bare.py --ready-only result (bare, trinity)")
    ap.add_argument("--update", metavar="DOC", help="rewrite the Summary section of this markdown file")
    args = ap.parse_args(argv)
    try:
        loads = [json.loads(Path(p).read_text()) for p in args.load]
        ready = json.loads(Path(args.ready).read_text())
        text = table(figures(loads, ready, args.load, args.ready), loads, args.load, ready, args.ready)
        if args.update:
            update(Path(args.update), text)
    except (OSError, json.JSONDecodeError, MissingFigure) as exc:
        print(f"summary_table: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
