"""Figures from the benchmark JSON files (matplotlib, PNG).

Inputs: serve_vs_bare.py results (``serve-<label>.json``, each with a bare phase and a trinity
phase) or plain loadgen.py results (``--loadgen A.json B.json ...``, one curve per file).
For each serve result it draws:

  <prefix>-<label>-throughput.png   output tokens/s against concurrency, one line per path
  <prefix>-<label>-latency.png      p50 (solid) and p99 (dashed) latency against concurrency
  <prefix>-<label>-ratio.png        throughput of each path / bare vLLM, with the 0.95 target
  <prefix>-ready.png                time to first answered request per path and model (bars)

and, when the result has loads with spread output lengths (serve_vs_bare.py --spread), the same
three figures for them as <prefix>-<label>-spread-{throughput,latency,ratio}.png.

Every figure carries, in small print, the command that produced the data and the machine.

    python bench/plot.py --out docs/figures bench/results/gpu/serve-*.json
    python bench/plot.py --out /tmp/fig --prefix testdouble --loadgen a.json b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

# (key in a serve result, label in the figures)
SERIES = (
    (("bare", "load"), "bare vLLM"),
    (("bare", "load_like_proxy"), "bare vLLM, logprobs + token ids (as the proxy asks)"),
    (("trinity", "load_engine_direct"), "Trinity's engine, direct (as the proxy asks)"),
    (("trinity", "load"), "through Trinity's proxy"),
    (("trinity-nogroup", "load"), "through Trinity's proxy, group commit off (upstream recorder)"),
    (("trinity-noff", "load"), "through Trinity's proxy, fast forward off"),
)
SPREAD_SERIES = (
    (("bare", "load_spread"), "bare vLLM"),
    (("trinity", "load_spread"), "through Trinity's proxy"),
    (("trinity-nogroup", "load_spread"), "through Trinity's proxy, group commit off (upstream recorder)"),
    (("trinity-noff", "load_spread"), "through Trinity's proxy, fast forward off"),
)


def series_from_serve(result: dict, series=SERIES) -> list[tuple[str, dict]]:
    out = []
    for (phase, key), label in series:
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


def _machine(result: dict) -> str:
    m = result.get("machine", {})
    parts = [m.get("gpu") or "", f"host {m.get('host')}", f"{m.get('cpus')} CPUs"]
    pk = m.get("packages") or {}
    if pk:
        parts.append(", ".join(f"{k} {v}" for k, v in pk.items() if v))
    return "; ".join(p for p in parts if p)


@dataclass
class Figure:
    """One figure: what draw() puts on it and the file it writes."""

    path: Path
    title: str
    xlabel: str
    ylabel: str = ""
    lines: list[tuple[list, list, dict]] = field(default_factory=list)  # xs, ys, Axes.plot keywords
    bars: list[tuple[str, float]] = field(default_factory=list)  # horizontal bars: label, value
    bar_colors: list[str] | None = None  # one per bar (default: cycling C0-C2)
    hlines: list[tuple[float, dict]] = field(default_factory=list)  # y, Axes.axhline keywords
    xlog: bool = False
    ylog: bool | None = None  # None: leave the y scale alone (the bars' axis is categorical)
    ylim: tuple[float, float] | None = None
    xticks: list[int] | None = None
    legend: float | None = 7  # legend font size; None: no legend
    grid: bool = True
    height: float = 4.6
    bottom: float = 0.06  # room below the axes for the caption
    note: str = ""


def draw(f: Figure) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, f.height))
    for xs, ys, style in f.lines:
        ax.plot(xs, ys, **style)
    if f.bars:
        ax.barh([b[0] for b in f.bars], [b[1] for b in f.bars], color=f.bar_colors or [f"C{i % 3}" for i in range(len(f.bars))])
        for i, (_, v) in enumerate(f.bars):
            ax.text(v, i, f" {v:.0f} s", va="center", fontsize=8)
        ax.invert_yaxis()
    for y, style in f.hlines:
        ax.axhline(y, **style)
    if f.ylim:
        ax.set_ylim(*f.ylim)
    scales = {"xscale": "log"} if f.xlog else {}
    if f.ylog is not None:
        scales["yscale"] = "log" if f.ylog else "linear"
    ax.set(**scales, xlabel=f.xlabel, ylabel=f.ylabel, title=f.title)
    if f.xticks is not None:
        ax.set_xticks(f.xticks)
        ax.set_xticklabels([str(c) for c in f.xticks])
        ax.minorticks_off()
    if f.grid:
        ax.grid(True, alpha=0.3)
    if f.legend:
        ax.legend(fontsize=f.legend)
    fig.text(0.01, 0.005, f.note, fontsize=6, color="0.35", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, f.bottom, 1, 1))
    f.path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(f.path, dpi=120)
    plt.close("all")
    return f.path


def plot_curves(curves: list[tuple[str, dict]], title: str, note: str, out_prefix: Path, target: float = 0.95) -> list[Path]:
    xticks = sorted({lv["concurrency"] for _, load in curves for lv in load["levels"]})

    def fig(kind: str, **kw) -> Figure:
        path = out_prefix.with_name(f"{out_prefix.name}-{kind}.png")
        return Figure(path, xlabel="concurrent requests", xlog=True, xticks=xticks, note=note, **kw)

    tps = [(label, *points(load, "tps")) for label, load in curves]
    ys_all = [y for _, _, ys in tps for y in ys]
    spread = max(ys_all) / min(ys_all) if ys_all and min(ys_all) > 0 else 1
    figs = [fig("throughput", title=f"{title}: throughput", ylabel="output tokens / s", ylog=spread > 20,
                lines=[(xs, ys, {"marker": "o", "label": label}) for label, xs, ys in tps])]
    latency = []
    for i, (label, load) in enumerate(curves):
        latency.append((*points(load, "p50"), {"marker": "o", "color": f"C{i}", "label": f"{label} p50"}))
        latency.append((*points(load, "p99"), {"marker": "x", "linestyle": "--", "color": f"C{i}", "label": f"{label} p99"}))
    figs.append(fig("latency", title=f"{title}: latency", ylabel="latency per request, s", ylog=True, lines=latency,
                    legend=6))
    if len(curves) > 1:  # throughput of each curve / the first one
        base_label, base = curves[0]
        lines = [(*ratios(base, load), {"marker": "o", "color": f"C{i}", "label": label})
                 for i, (label, load) in enumerate(curves) if i]
        hlines = [(1.0, {"color": "0.5", "linewidth": 0.8})]
        if target:
            hlines.append((target, {"color": "red", "linestyle": ":", "label": f"target: {target} at concurrency 32"}))
        top = max([1.05, *(y * 1.05 for _, ys, _ in lines for y in ys)])
        figs.append(fig("ratio", title=f"{title}: ratio to {base_label}", ylabel=f"throughput / {base_label}",
                        lines=lines, hlines=hlines, ylim=(0, top)))
    return [draw(f) for f in figs]


def plot_ready(results: list[dict], note: str, path: Path) -> Path | None:
    names = (("bare", "bare vllm serve"), ("trinity", "rftstack serve"), ("manual", "ray start + trinity run"))
    rows, colors = [], []
    for res in results:
        for i, (key, label) in enumerate(names):  # one colour per path, whatever the model
            r = res.get("phases", {}).get(key, {}).get("ready", {})
            if r.get("ready"):
                rows.append((f"{res['label']}: {label}", r.get("first_answer_incl_ray_start_s", r["first_answer_s"])))
                colors.append(f"C{i}")
    if not rows:
        return None
    return draw(Figure(path, title="Time to ready", xlabel="seconds from start to the first answered chat completion",
                       bars=rows, bar_colors=colors, legend=None, grid=False, height=0.5 * len(rows) + 1.6, bottom=0.08, note=note))


def _read(f: str, what: str) -> dict | None:
    try:
        return json.loads(Path(f).read_text())
    except (OSError, ValueError) as exc:
        print(f"plot: cannot read {f} ({exc}); pass a {what} result file", file=sys.stderr)
        return None


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
        res = _read(f, "serve_vs_bare.py")
        if res is None:
            return 2
        serve_results.append(res)
        note = args.note or f"{res.get('command', '')}\n{_machine(res)}; {res.get('started', '')}"
        curves = series_from_serve(res)
        if curves:
            written += plot_curves(curves, args.title or f"{res['label']} model", note, out / f"{args.prefix}-{res['label']}", args.target)
        spread = series_from_serve(res, SPREAD_SERIES)
        if spread:
            s = res.get("settings", {}).get("spread")
            written += plot_curves(spread, (args.title or f"{res['label']} model") + f", lengths spread ±{s}", note,
                                   out / f"{args.prefix}-{res['label']}-spread", args.target)
    if serve_results:
        note = args.note or "\n".join(sorted({_machine(r) for r in serve_results}))
        p = plot_ready(serve_results, note, out / f"{args.prefix}-ready.png")
        if p:
            written.append(p)
    if args.loadgen:
        curves = []
        for f in args.loadgen:
            lg = _read(f, "loadgen.py")
            if lg is None:
                return 2
            curves.append((lg.get("label") or Path(f).stem, lg))
        note = args.note or f"loadgen.py; host {curves[0][1].get('machine', {}).get('host')}"
        written += plot_curves(curves, args.title or args.prefix, note, out / args.prefix, args.target)
    for p in written:
        print(p)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
