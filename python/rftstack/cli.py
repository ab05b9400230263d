"""The `rftstack` command line: a thin dispatcher over one module per command.

Each command module exposes ``configure(parser)`` (adds its arguments) and ``run(args) -> int``.
Modules are imported only when their command runs, so `rftstack doctor` stays fast and no
module imports this one.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rftstack import __version__
from rftstack.errors import UserError

# name -> (module, one-line summary). Summaries live here so `rftstack --help` imports nothing.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("rftstack.run.serve", "preflight, a loopback Ray head, then Trinity serve mode, supervised"),
    "train": ("rftstack.run.train", "preflight, a loopback Ray head, then Trinity train mode (verl) on a serve's experiences, supervised"),
    "ray-head": ("rftstack.run.ray_head", "start/stop a Ray head with token auth, on loopback or (--listen) a private address"),
    "ray-worker": ("rftstack.run.ray_worker", "start/stop a Ray worker node that joins a head with its token"),
    "doctor": ("rftstack.doctor.collect", "find every known way this stack breaks on this machine, in seconds"),
    "env": ("rftstack.stack.env_report", "report the installed stack against the lock and the policy"),
    "flavour": ("rftstack.bundle.flavour", "turn a synced environment into the CUDA 12 flavour (driver 570) from the policy and the lock"),
    "relax": ("rftstack.stack.relax", "apply the policy's metadata relaxations so `pip check` is clean"),
    "example-config": ("rftstack.run.report_config", "write a serve config of the user report's shape for a model directory"),
    "tiny-model": ("rftstack.run.tinymodel", "write a tiny random Qwen2 model directory (no download)"),
    "bundle": ("rftstack.bundle.build", "build or install an offline wheel bundle of the locked stack"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rftstack",
        description="Reproducible Trinity-RFT serve mode: install checks, preflight and a supervised launcher.",
    )
    parser.add_argument("--version", action="version", version=f"rftstack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if name == command:
            importlib.import_module(module_name).configure(p)
    return parser


def _command_in(argv: list[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"rftstack {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head` and the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"rftstack {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
