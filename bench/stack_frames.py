#!/usr/bin/env python3
"""How long each server's frontend process spent in named frames, a response, from serve_profile.py's profile windows.

    python bench/stack_frames.py RESULT.json STACKS_DIR [--frame NAME ...] [--level 64] [--process VLLM::Worker]

RESULT.json is a serve_profile.py result whose servers had a profile window (--py-spy), STACKS_DIR the folder of its
``*.collapsed.gz`` stacks. The frontend is the process that runs vLLM's OpenAI server: bare `vllm serve`'s, the Ray
actor's of ``@ray-actor`` (bench/vllm_in_ray.py), Trinity's engine actor in the serve. Per server and frame: the
samples whose stack holds that frame (a frame named as py-spy names it, ``Class.method`` without the file; the first
match of a stack counts once), as ms a response (samples / the window's py-spy rate / the window's responses; py-spy
samples a thread only while it runs). Markdown, one row per server in the order they ran. ``--process NAME`` counts
another profiled process instead of the frontend (a target as serve_profile.py names it: ``VLLM::Worker``,
``VLLM::EngineCore``), in each window that profiled it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_table  # noqa: E402
import serve_profile  # noqa: E402

# the frames docs/benchmarks.md reads (session AC): anyio's worker-thread path, vLLM's output handler and processor
FRAMES = ("run_in_threadpool", "AsyncLLM._run_output_handler.<locals>.output_handler", "OutputProcessor.process_outputs")
FRONTENDS = ("*vllm serve", "ray::VllmServeActor", "ray::vLLMRolloutModel")


def frontend_windows(result: dict, process: str | None = None) -> list[tuple[str, dict, str]]:
    """(server name, its profile, the frontend's target) of each server with a profile window, in the order they ran;
    a bare variant named as bench/engine_table.py names it (host_session.sh's variables for their words). With
    ``process``, that target instead of the frontend, in the windows that profiled it."""
    names = engine_table.host_session_names()
    windows = []
    if result.get("serve", {}).get("profile"):
        windows.append(("serve", result["serve"]["profile"]))
    for key, phase in result.get("bare_variants", {}).items():
        prof = phase.get("profile_numeric") or phase.get("profile")
        if prof:
            windows.append((engine_table.variant_label(key, names), prof))
    out = []
    for name, prof in windows:
        if process is None:
            out.append((name, prof, next(t for t in FRONTENDS if t in prof["targets"])))
        elif "py_spy" in prof["targets"].get(process, {}):
            out.append((name, prof, process))
    return out


def collapsed_path(stacks: Path, prof: dict, target: str, level: str) -> Path:
    """The stacks file profile_targets wrote for ``target``: its label is the raw file's name less ``-PID.raw.txt``."""
    raw = prof["targets"][target]["py_spy"]["command"].split(" -o ", 1)[1].split()[0]
    return serve_profile.collapsed_file(stacks, re.sub(r"-\d+\.raw\.txt$", "", Path(raw).name), target, level)


def rate(prof: dict, target: str) -> int:
    return int(prof["targets"][target]["py_spy"]["command"].split("--rate ", 1)[1].split()[0])


def frame_ms(path: Path, frames: tuple[str, ...], responses: int, hz: int) -> dict[str, float]:
    """ms a response of samples holding each frame, and of all the process's samples (``*``)."""
    counts = dict.fromkeys(("*", *frames), 0)
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        stack, n = line.rsplit(" ", 1)
        names = {f.split(" (")[0] for f in stack.split(";")}
        counts["*"] += int(n)
        for fr in frames:
            if fr in names:
                counts[fr] += int(n)
    return {k: 1000 * v / hz / responses for k, v in counts.items()}


def rows(result: dict, stacks: Path, frames: tuple[str, ...] = FRAMES, level: str = "64",
         process: str | None = None) -> list[tuple[str, str, dict]]:
    out = []
    for name, prof, target in frontend_windows(result, process):
        ms = frame_ms(collapsed_path(stacks, prof, target, level), frames, prof["window"]["responses"], rate(prof, target))
        out.append((name, target, ms))
    return out


def short(name: str) -> str:
    return name.split(".<locals>.")[-1] if ".<locals>." in name else name


def table(result: dict, stacks: Path, frames: tuple[str, ...] = FRAMES, level: str = "64",
          process: str | None = None) -> str:
    head = f"| server | {'process' if process else 'frontend'} | all samples | " + \
        " | ".join(f"`{short(f)}`" for f in frames) + " |"
    lines = [head, "|" + "---|" * (3 + len(frames))]
    found = rows(result, stacks, frames, level, process)
    if not found:
        raise ValueError(f"stack_frames: no profile window in this result profiled {process or 'a frontend'}; "
                         "give a target that serve_profile.py --py-spy recorded")
    for name, target, ms in found:
        lines.append(f"| {name} | {target.strip('*')} | {ms['*']:.2f} | " + " | ".join(f"{ms[f]:.2f}" for f in frames) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path)
    ap.add_argument("stacks", type=Path)
    ap.add_argument("--frame", action="append", default=None, help="a frame to count (repeatable; default: FRAMES)")
    ap.add_argument("--level", default="64")
    ap.add_argument("--process", default=None, help="count this profiled process instead of the frontend (VLLM::Worker)")
    args = ap.parse_args(argv)
    if not args.result.is_file() or not args.stacks.is_dir():
        print(f"stack_frames: give a serve_profile result file and its stacks folder ({args.result}, {args.stacks})",
              file=sys.stderr)
        return 2
    try:
        print(table(json.loads(args.result.read_text()), args.stacks, tuple(args.frame or FRAMES), args.level, args.process))
    except ValueError as e:  # no window profiled the process asked for
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
