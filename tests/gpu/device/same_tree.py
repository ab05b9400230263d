"""Whether the installed rftstack is the one of a source tree: the same package files, policy and patches.

Run on the GPU host after `install.py` (go.sh): python3 same_tree.py /tmp/repo. A bundle carries the
rftstack wheel of the commit it was built from, and `install.py` applies that wheel's patches; a bundle
built before a patch changed runs the old patch under the new tests and benchmarks (session O, 2026-12-03:
`RFTSTACK_ENGINE_EXECUTOR=uni` refused by the older patch), and one built before any change to rftstack's
code runs the old code. Exit 0 when they match, 1 with the files that differ, 2 when rftstack is not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

# What the wheel adds to python/rftstack (pyproject.toml's force-include): compared on their own or not at all.
WHEEL_ONLY = ("data/patches/", "data/uv.lock")


def digests(root: Path, sha256: Callable[[Path], str], skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file below ``root`` by its relative path, without byte code and the ``skip`` prefixes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and "__pycache__" not in p.parts and not rel.startswith(skip):
            out[rel] = sha256(p)
    return out


def differences(want: dict[str, str], have: dict[str, str]) -> list[str]:
    """The names of the files that are not byte-identical between the tree (``want``) and the install."""
    out = [
        f"{name} ({'missing from the install' if name not in have else 'differs'})"
        for name in want
        if want[name] != have.get(name)
    ]
    return out + [f"{name} (only in the install)" for name in have if name not in want]


def main(argv: list[str]) -> int:
    tree = Path(argv[1] if len(argv) > 1 else ".").resolve()
    try:
        import rftstack
        from rftstack.stack.patches import patches_dir, sha256
    except ImportError:
        print("rftstack is not installed for this Python; install the bundle first (install.py)")
        return 2
    installed = Path(rftstack.__file__).resolve().parent
    tree_patches = digests(tree / "patches", sha256)
    diff = differences(digests(tree / "python" / "rftstack", sha256), digests(installed, sha256, WHEEL_ONLY))
    diff += differences(tree_patches, digests(patches_dir(), sha256))
    if diff:
        print(f"the installed rftstack ({installed}) is not the one of {tree}: {', '.join(diff)}")
        return 1
    print(f"the installed rftstack matches {tree} (its package files and {len(tree_patches)} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
