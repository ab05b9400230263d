"""serve_profile.py's result files as one Markdown table of the engine's own account: per server and level, the
window whose requests carry the proxy's fields with numeric logprobs (the serve's engine reached directly, bare with
the same fields), its responses/s, vLLM's engine steps a second and tokens a step, the mean time a request was
scheduled, and the CPU the EngineCore's busiest thread spent a step (from the window's per-thread CPU).

    python bench/engine_table.py RESULT.json[=LABEL] [RESULT.json[=LABEL] ...] [--levels 64,32]

The serve of each file is labelled LABEL (default: the file's name), its bare variants "bare " and the variant's
arguments as host_session.sh names them (TRINITY_ENGINE_ARGS, TRINITY_LIKE_ARGS, TRINITY_ACTOR_ENV). docs/benchmarks.md's session Y
table is this script's output, and a test checks it against the files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST_SESSION = HERE.parent / "tests" / "gpu" / "host_session.sh"


def host_session_defaults() -> tuple[str, str]:
    """host_session.sh's default TRINITY_ENGINE_ARGS and TRINITY_LIKE_ARGS (the tests read them here too)."""
    script = HOST_SESSION.read_text()
    engine = script.split("TRINITY_ENGINE_ARGS=${TRINITY_ENGINE_ARGS:-", 1)[1].split("}", 1)[0]
    like = script.split("TRINITY_LIKE_ARGS_DEFAULT='", 1)[1].split("'", 1)[0]
    return engine, like


def host_session_actor_env() -> str:
    """host_session.sh's default TRINITY_ACTOR_ENV: the variables Trinity's engine actor sets, as NAME=VALUE words."""
    return HOST_SESSION.read_text().split("TRINITY_ACTOR_ENV_DEFAULT='", 1)[1].split("'", 1)[0]


def host_session_names() -> dict[str, str]:
    """The defaults by their text: how a bare variant is named."""
    engine, like = host_session_defaults()
    return {engine: "TRINITY_ENGINE_ARGS", like: "TRINITY_LIKE_ARGS", host_session_actor_env(): "TRINITY_ACTOR_ENV"}


def engine_core_ms_per_step(window: dict) -> float | None:
    """ms of CPU the EngineCore's busiest thread spent per engine step in this window."""
    steps = (window.get("engine") or {}).get("steps_per_s")
    for p in window["processes"]:
        if "EngineCore" in p["title"] and p["top_threads"] and steps:
            return 1000 * p["top_threads"][0]["cores"] / steps
    return None


def row(label: str, c: str, w: dict) -> str:
    e = w["engine"]
    ms = engine_core_ms_per_step(w)
    return (f"| {label} | {c} | {w['responses_per_s']:.1f} | {e['steps_per_s']:.0f} | {e['tokens_per_step']:.1f} | "
            f"{e['mean_s']['request_inference_time']:.3f} | {ms:.2f} |")


def variant_label(variant: str, names: dict[str, str]) -> str:
    for text, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
        variant = variant.replace(text, name)
    return "bare " + " ".join(variant.split())


def table(files: list[tuple[Path, str]], levels: list[str], names: dict[str, str]) -> str:
    out = ["| server | c | responses/s | engine steps/s | tokens a step | scheduled s a request | EngineCore ms a step |",
           "|---|---|---|---|---|---|---|"]
    results = [(json.loads(path.read_text()), label) for path, label in files]
    for c in levels:
        for r, label in results:
            if "serve" in r:
                out.append(row(label, c, r["serve"]["levels"][c]["engine_numeric"]))
            for v, b in (r.get("bare_variants") or {}).items():
                out.append(row(variant_label(v, names), c, b["levels"][c]["bare_like_proxy_numeric"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="serve_profile.py result files, each optionally =LABEL")
    ap.add_argument("--levels", default="64,32")
    args = ap.parse_args(argv)
    files = []
    for spec in args.results:
        path, _, label = spec.partition("=")
        if not Path(path).is_file():
            print(f"engine_table: {path} is not a file; give serve_profile.py result files", file=sys.stderr)
            return 2
        files.append((Path(path), label or Path(path).stem))
    print(table(files, args.levels.split(","), host_session_names()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
