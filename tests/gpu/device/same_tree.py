"""Whether the installed rftstack is the one of a source tree: the same policy and the same patch files.

Run on the GPU host after `install.py` (go.sh): python3 same_tree.py /tmp/repo. A bundle carries the
rftstack wheel of the commit it was built from, and `install.py` applies that wheel's patches; a bundle
built before a patch changed runs the old patch under the new tests and benchmarks (session O, 2026-12-03:
`RFTSTACK_ENGINE_EXECUTOR=uni` refused by the older patch). Exit 0 when they match, 1 with the files that
differ, 2 when rftstack is not installed.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def digests(folder: Path, pattern: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob(pattern))}


def differences(tree: Path, installed: Path, installed_patches: Path) -> list[str]:
    """Names of the patch and policy files that are not byte-identical between the tree and the install."""
    pairs = [
        (digests(tree / "patches", "*.patch"), digests(installed_patches, "*.patch")),
        (digests(tree / "python" / "rftstack" / "data", "policy.toml"), digests(installed / "data", "policy.toml")),
    ]
    out: list[str] = []
    for want, have in pairs:
        out += [
            f"{name} ({'missing from the install' if name not in have else 'differs'})"
            for name in want
            if want[name] != have.get(name)
        ]
        out += [f"{name} (only in the install)" for name in have if name not in want]
    return out


def main(argv: list[str]) -> int:
    tree = Path(argv[1] if len(argv) > 1 else ".").resolve()
    try:
        import rftstack
        from rftstack.stack.patches import patches_dir
    except ImportError:
        print("rftstack is not installed for this Python; install the bundle first (install.py)")
        return 2
    installed = Path(rftstack.__file__).resolve().parent
    diff = differences(tree, installed, patches_dir())
    if diff:
        print(f"the installed rftstack ({installed}) is not the one of {tree}: {', '.join(diff)}")
        return 1
    print(f"the installed rftstack matches {tree} (policy and {len(list((tree / 'patches').glob('*.patch')))} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
