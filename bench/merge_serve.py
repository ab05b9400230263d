"""Merge serve_vs_bare.py results of one model measured over several calls (each device call gets a
fresh output folder), later files' phases replacing earlier ones; the summary is recomputed.

    python bench/merge_serve.py --out results/serve-qwen3b.json call2/serve-qwen3b.json call2b/serve-qwen3b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_vs_bare  # noqa: E402


def merge(results: list[dict]) -> dict:
    labels = {r.get("label") for r in results}
    if len(labels) != 1:
        raise ValueError(f"the files are of different models/labels: {sorted(map(str, labels))}")
    out = dict(results[-1])
    out["phases"] = {}
    out["earlier_calls"] = []
    for r in results:
        out["phases"].update(r.get("phases", {}))
        if r is not results[-1]:
            out["earlier_calls"].append({"command": r.get("command"), "started": r.get("started"), "machine": r.get("machine")})
    out["summary"] = serve_vs_bare.summary(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        results = [json.loads(Path(f).read_text()) for f in args.files]
        merged = merge(results)
    except (OSError, ValueError) as exc:
        print(f"merge_serve: {exc}; pass serve_vs_bare.py result files of one --label", file=sys.stderr)
        return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(merged["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
