"""The Summary table at the top of docs/benchmarks.md, computed from serve_vs_bare.py results.

One row per figure, in the form a script reads (`| name | value |`), then the run each comes from:

    python bench/summary_table.py --load bench/results/gpu-X/serve-qwen3b-ff.json \\
        --ready bench/results/gpu-X/serve-qwen3b-warm.json
    python bench/summary_table.py --load ... --ready ... --update docs/benchmarks.md

--load: a run with the `bare` and `trinity` phases, equal lengths at c=32 and c=64 and spread
lengths at c=64 (`--spread 0.75 --spread-levels 32,64`). --ready: a `--ready-only` run with
`bare` and `trinity` on warm caches. --update rewrites the table and the runs under it in the
`## Summary` section (up to the next heading) of that file, and nothing else: the text before the
table stays.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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


def _throughput(result: dict, key: str, concurrency: int, where: str) -> float:
    bare = _level(_phase(result, "bare", where), key, concurrency, where)["output_tokens_per_s"]
    proxy = _level(_phase(result, "trinity", where), key, concurrency, where)["output_tokens_per_s"]
    return proxy / bare


def p99_ratio(result: dict, where: str, phase: str = "trinity") -> float:
    """The proxy's (``phase``'s) p99 latency over bare's, equal lengths at c=32."""
    bare = _level(_phase(result, "bare", where), "load", 32, where)["latency_s"]["p99"]
    proxy = _level(_phase(result, phase, where), "load", 32, where)["latency_s"]["p99"]
    return proxy / bare


def figures(load: dict, ready: dict, load_name: str, ready_name: str) -> list[tuple[str, str, str]]:
    """(figure, value as printed, source) rows, in the order the table lists them."""
    ready_s = {name: (_phase(ready, name, ready_name).get("ready") or {}).get("models_s") for name in ("bare", "trinity")}
    if not all(ready_s.values()):
        raise MissingFigure(f"{ready_name}: a phase never became ready ({ready_s}); rerun it")
    for name in ("bare", "trinity"):
        if compiled := serve_vs_bare.compiled_before_ready(_phase(ready, name, ready_name)):
            raise MissingFigure(
                f"{ready_name}: its {name} phase compiled the model before it was ready ({compiled} new files in "
                f"vLLM's compile cache), so its time to ready is not a warm one; rerun the --ready-only run after "
                f"a run that started the model in both servers")
    return [
        ("proxy/bare c=64 equal", f"{_throughput(load, 'load', 64, load_name):.2f}", load_name),
        ("proxy/bare c=64 spread", f"{_throughput(load, 'load_spread', 64, load_name):.2f}", load_name),
        ("proxy/bare c=32 equal", f"{_throughput(load, 'load', 32, load_name):.2f}", load_name),
        ("p99 proxy/bare c=32", f"{p99_ratio(load, load_name):.2f}", load_name),
        ("ready/bare warm", f"{ready_s['trinity'] / ready_s['bare']:.2f}", ready_name),
    ]


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


def table(rows: list[tuple[str, str, str]], load: dict, ready: dict) -> str:
    out = [TABLE_HEAD, "|---|---|"]
    out += [f"| {name} | {value} |" for name, value, _ in rows]
    out.append("")
    for source, result in ((rows[0][2], load), (rows[-1][2], ready)):
        note = steal_note(result) if result is load else ""
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
    ap.add_argument("--load", required=True, help="serve_vs_bare.py result with load runs (bare, trinity)")
    ap.add_argument("--ready", required=True, help="serve_vs_bare.py --ready-only result (bare, trinity)")
    ap.add_argument("--update", metavar="DOC", help="rewrite the Summary section of this markdown file")
    args = ap.parse_args(argv)
    try:
        load, ready = (json.loads(Path(p).read_text()) for p in (args.load, args.ready))
        text = table(figures(load, ready, args.load, args.ready), load, ready)
        if args.update:
            update(Path(args.update), text)
    except (OSError, json.JSONDecodeError, MissingFigure) as exc:
        print(f"summary_table: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
