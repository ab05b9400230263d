"""The largest bundle part, in whole MiB, that one device call can carry beside this working tree.

A device call carries the working tree (tracked files and untracked ones git does not ignore) plus the paths
named in `carry`, "at most 64 MiB" in all. The bundle's parts travel one per call, so a part may be as large as
that limit less the tree less a margin. The tree grows with every session's results and logs: 16 MiB in session W,
19.5 MiB in session AF, whose 44 MiB parts (kit.sh's fixed size until then) were refused with "the working tree is
larger than 64 MiB" although the two made 63.5 MiB, and 38 MiB parts went through. So the limit is taken here as
64 million bytes (61.0 MiB), the reading that agrees with both.

    python3 tests/gpu/device/part_size.py [REPO]          # prints the part size in MiB, e.g. 39
    python3 tests/gpu/device/part_size.py --explain REPO  # one line: tree size, limit, margin, part size

Exit 1 with one sentence when the tree alone leaves no room for a useful part (under 8 MiB).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT_BYTES = 64_000_000
MARGIN_MIB = 2
MIN_PART_MIB = 8
MAX_PART_MIB = 60  # rftstack bundle build's default


def tree_bytes(repo: Path) -> int:
    """Bytes of the files a device call carries from ``repo``: tracked, and untracked that git does not ignore."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout
    total = 0
    for name in filter(None, out.decode().split("\0")):
        p = repo / name
        if p.is_file() and not p.is_symlink():  # a tracked file deleted in the work tree is not carried
            total += p.stat().st_size
    return total


def part_size(tree: int, limit: int = LIMIT_BYTES, margin_mib: int = MARGIN_MIB) -> int:
    """Whole MiB left for one part beside ``tree`` bytes, capped at MAX_PART_MIB; may be below MIN_PART_MIB."""
    room = limit - tree - margin_mib * 2**20
    return max(0, min(MAX_PART_MIB, room // 2**20))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", nargs="?", default=str(Path(__file__).resolve().parents[3]))
    ap.add_argument("--explain", action="store_true", help="print the tree's size and the arithmetic too")
    args = ap.parse_args(argv)
    repo = Path(args.repo)
    try:
        tree = tree_bytes(repo)
    except (subprocess.CalledProcessError, FileNotFoundError):
        print(f"part_size: {repo} is not a git checkout; run it on the project's checkout", file=sys.stderr)
        return 2
    size = part_size(tree)
    if size < MIN_PART_MIB:
        print(f"part_size: the working tree is {tree / 2**20:.1f} MiB, leaving {size} MiB of the "
              f"{LIMIT_BYTES / 2**20:.1f} MiB a device call carries; move large untracked files out of the tree or into an ignored folder",
              file=sys.stderr)
        return 1
    if args.explain:
        print(f"tree {tree / 2**20:.1f} MiB, limit {LIMIT_BYTES / 2**20:.1f} MiB, margin {MARGIN_MIB} MiB: "
              f"parts of {size} MiB")
    else:
        print(size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
