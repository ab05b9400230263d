"""Figures from the benchmark JSON files (matplotlib, PNG).

Inputs: serve_vs_bare.py results (``serve-<label>.json``, each with a bare phase and a trinity
phase) or plain loadgen.py results (``--loadgen A.json B.json ...``, one curve per file).
For each serve result it draws:

  <prefix>-<label>-throughput.png   output tokens/s against concurrency, one line per path
  <prefix>-<label>-latency.png      p50 (solid) and p99 (dashed) latency against concurrency
  <prefix>-<label>-ratio.png        throughput of each path / bare vLLM, with the 0.95 target
  <prefix>-ready.png                time to first answered request per path and model (bars)

Every figure carries, in small print, the command that produced the data and the machine.

    python bench/plot.py --out docs/figures bench/results/gpu/serve-*.json
    python bench/plot.py --out /tmp/fig --prefix testdouble --loadgen a.json b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (key in a serve result, label in the figures)
SERIES = (
    (("bare", "load"), "bare vLLM"),
    (("bare", "load_like_proxy"), "bare vLLM, logprobs + token ids (as the proxy asks)"),
    (("trinity", "load_engine_direct"), "Trinity's engine, direct (as the proxy asks)"),
    (("trinity", "load"), "through Trinity's proxy"),
)


def series_from_serve(result: dict) -> list[tuple[str, dict]]:
    out = []
    for (phase, key), label in SERIES:
        load = result.get("phases", {}).get(phase, {}).get(key)
        if load and load.get("levels"):
            out.append((label, load))
    return out


def points(load: dict, metric: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for lv in load["levels"]:
        v = lv["output_tokens_per_s"] if metric == "tps" else (lv["latency_s"] or {}).get(metric)
        if v is not None and lv.get("ok"):
            xs.append(lv["concurrency"])
            ys.append(v)
    return xs, ys


def ratios(base: dict, other: dict) -> tuple[list[int], list[float]]:
    b = {lv["concurrency"]: lv["output_tokens_per_s"] for lv in base["levels"] if lv.get("output_tokens_per_s")}
    xs, ys = [], []
    for lv in other["levels"]:
        c = lv["concurrency"]
        if c in b and lv.get("output_tokens_per_s") is not None:
            xs.append(c)
            ys.append(lv["output_tokens_per_s"] / b[c])
    return xs, ys


def caption(fig, text: str) -> None:
    fig.text(0.01, 0.005, text, fontsize=6, color="0.35", ha="left", va="bottom", wrap=True)


def _machine(result: dict) -> str:
    m = result.get("machine", {})
    parts = [m.get("gpu") or "", f"host {m.get('host')}", f"{m.get('cpus')} CPUs"]
    pk = m.get("packages") or {}
    if pk:
        parts.append(", ".join(f"{k} {v}" for k, v in pk.items() if v))
    return "; ".join(p for p in parts if p)


def plot_curves(curves: list[tuple[str, dict]], title: str, note: str, out_prefix: Path, target: float = 0.95) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    # throughput
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ys_all = []
    for label, load in curves:
        xs, ys = points(load, "tps")
        ys_all += ys
        ax.plot(xs, ys, marker="o", label=label)
    spread = max(ys_all) / min(ys_all) if ys_all and min(ys_all) > 0 else 1
    ax.set(xscale="log", yscale="log" if spread > 20 else "linear", xlabel="concurrent requests",
           ylabel="output tokens / s", title=f"{title}: throughput")
    _ticks(ax, curves)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    caption(fig, note)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(_save(fig, out_prefix.with_name(out_prefix.name + "-throughput.png")))
    # latency
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i, (label, load) in enumerate(curves):
        color = f"C{i}"
        ax.plot(*points(load, "p50"), marker="o", color=color, label=f"{label} p50")
        ax.plot(*points(load, "p99"), marker="x", linestyle="--", color=color, label=f"{label} p99")
    ax.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="latency per request, s", title=f"{title}: latency")
    _ticks(ax, curves)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    caption(fig, note)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(_save(fig, out_prefix.with_name(out_prefix.name + "-latency.png")))
    # ratio to the first curve
    if len(curves) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.6))
        base_label, base = curves[0]
        top = 1.05
        for i, (label, load) in enumerate(curves[1:], start=1):
            xs, ys = ratios(base, load)
            ax.plot(xs, ys, marker="o", color=f"C{i}", label=label)
            top = max([top, *(y * 1.05 for y in ys)])
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.set_ylim(0, top)
        if target:
            ax.axhline(target, color="red", linestyle=":", label=f"target: {target} at concurrency 32")
        ax.set(xscale="log", xlabel="concurrent requests", ylabel=f"throughput / {base_label}", title=f"{title}: ratio to {base_label}")
        _ticks(ax, curves)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        caption(fig, note)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        written.append(_save(fig, out_prefix.with_name(out_prefix.name + "-ratio.png")))
    plt.close("all")
    return written


def plot_ready(results: list[dict], note: str, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = (("bare", "bare vllm serve"), ("trinity", "rftstack serve"), ("manual", "ray start + trinity run"))
    rows = []
    for res in results:
        for key, label in names:
            r = res.get("phases", {}).get(key, {}).get("ready", {})
            if r.get("ready"):
                rows.append((f"{res['label']}: {label}", r.get("first_answer_incl_ray_start_s", r["first_answer_s"])))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.6))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=[f"C{i % 3}" for i in range(len(rows))])
    for i, (_, v) in enumerate(rows):
        ax.text(v, i, f" {v:.0f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="seconds from start to the first answered chat completion", title="Time to ready")
    caption(fig, note)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = _save(fig, path)
    plt.close("all")
    return out


def _ticks(ax, curves) -> None:
    cs = sorted({lv["concurrency"] for _, load in curves for lv in load["levels"]})
    ax.set_xticks(cs)
    ax.set_xticklabels([str(c) for c in cs])
    ax.minorticks_off() if hasattr(ax, "minorticks_off") else None


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="serve_vs_bare.py result files (serve-<label>.json)")
    ap.add_argument("--loadgen", nargs="+", default=[], help="loadgen.py result files: one curve each, the first is the base")
    ap.add_argument("--out", required=True, help="directory for the PNG files")
    ap.add_argument("--prefix", default="serve", help="file name prefix (default serve)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--note", default=None, help="caption text (default: the command and machine in the JSON)")
    ap.add_argument("--target", type=float, default=0.95, help="the ratio target line (0: none)")
    args = ap.parse_args(argv)
    if not args.inputs and not args.loadgen:
        print("plot: no input files; pass serve_vs_bare.py results or --loadgen files", file=sys.stderr)
        return 2
    out = Path(args.out)
    written: list[Path] = []
    serve_results = []
    for f in args.inputs:
        try:
            res = json.loads(Path(f).read_text())
        except (OSError, ValueError) as exc:
            print(f"plot: cannot read {f} ({exc}); pass a serve_vs_bare.py result file", file=sys.stderr)
            return 2
        serve_results.append(res)
        note = args.note or f"{res.get('command', '')}\n{_machine(res)}; {res.get('started', '')}"
        curves = series_from_serve(res)
        if curves:
            written += plot_curves(curves, args.title or f"{res['label']} model", note, out / f"{args.prefix}-{res['label']}", args.target)
    if serve_results:
        note = args.note or "\n".join(sorted({_machine(r) for r in serve_results}))
        p = plot_ready(serve_results, note, out / f"{args.prefix}-ready.png")
        if p:
            written.append(p)
    if args.loadgen:
        curves = []
        for f in args.loadgen:
            try:
                lg = json.loads(Path(f).read_text())
            except (OSError, ValueError) as exc:
                print(f"plot: cannot read {f} ({exc}); pass a loadgen.py result file", file=sys.stderr)
                return 2
            curves.append((lg.get("label") or Path(f).stem, lg))
        note = args.note or f"loadgen.py; host {curves[0][1].get('machine', {}).get('host')}"
        written += plot_curves(curves, args.title or args.prefix, note, out / args.prefix, args.target)
    for p in written:
        print(p)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
