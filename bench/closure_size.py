"""Download size of the locked environment, per flavour, from uv.lock's per-wheel ``size`` fields.

The flake's real closure size cannot be known here: `nix/testing/eval-outputs.sh` evaluates the
flake against a stand-in for nixpkgs, so nothing is built. What the lock does tell exactly is the
size of the wheels each flavour installs (compressed: installed size is larger; this script also
reports the ratio measured on this machine when an install result is given):

  cuda13      the lock as `uv sync` installs it (PyPI wheels, CUDA 13)
  driver-570  the same walk with every edge to a policy.toml [[cuda12.drop]] distribution removed
              (what overlays/cuda12.nix does); the CUDA 12.8 libraries that replace them come from
              nixpkgs' cudaPackages_12_8 (not in the lock: not counted), and the four
              [[cuda12.artifact]] wheels (torch/vision/audio cu128, vLLM cu129) are counted at the
              size of the PyPI wheel they replace (their own sizes are not in the lock)

    python bench/closure_size.py --python 3.12 [--install-json bench/results/install-cpu/install.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from rftstack.stack import lockfile
from rftstack.stack import policy  # noqa: E402


def wheel_tags(python: str) -> list:
    """Supported tags for CPython ``python`` on manylinux x86_64, best first."""
    from packaging import tags

    major, minor = (int(x) for x in python.split(".")[:2])
    plats = [f"manylinux_2_{m}_x86_64" for m in range(39, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                      "manylinux1_x86_64", "linux_x86_64"]
    return list(tags.cpython_tags((major, minor), platforms=plats)) + list(tags.compatible_tags((major, minor), platforms=plats))


def pick_wheel(pkg: lockfile.LockedPackage, ranking: dict) -> lockfile.Artifact | None:
    from packaging.utils import parse_wheel_filename

    best, best_rank = None, None
    for w in pkg.wheels:
        try:
            _, _, _, wtags = parse_wheel_filename(w.filename)
        except ValueError:
            continue
        r = min((ranking[t] for t in wtags if t in ranking), default=None)
        if r is not None and (best_rank is None or r < best_rank):
            best, best_rank = w, r
    return best


def walk(lock: lockfile.Lock, env: dict, groups: tuple[str, ...], dropped: set[str]) -> dict[str, lockfile.LockedPackage]:
    """Lock.resolve, with every edge to a ``dropped`` name removed (overlays/cuda12.nix's rewrite)."""
    return lock.resolve(env, groups, exclude={policy.canonical(d) for d in dropped})


def sizes(pkgs: dict[str, lockfile.LockedPackage], python: str) -> dict:
    ranking = {t: i for i, t in enumerate(wheel_tags(python))}
    rows, missing = [], []
    for name, p in sorted(pkgs.items()):
        if p.is_root:
            continue
        w = pick_wheel(p, ranking)
        art = w or p.sdist
        if art is None or art.size is None:
            missing.append(name)
            continue
        rows.append((name, p.version, art.size, "wheel" if w else "sdist"))
    rows.sort(key=lambda r: -r[2])
    return {
        "packages": len(rows) + len(missing),
        "bytes": sum(r[2] for r in rows),
        "sdists": [r[0] for r in rows if r[3] == "sdist"],
        "no_size": missing,
        "largest": [{"name": n, "version": v, "bytes": s} for n, v, s, _ in rows[:12]],
        "_all": {n: s for n, _, s, _ in rows},
    }


def report(python: str, groups: tuple[str, ...], install_json: Path | None) -> dict:
    lock = lockfile.load()
    pol = policy.load()
    dropped = {policy.canonical(d["dist"]) for d in pol.cuda12.get("drop", [])}
    env = lockfile.target_environment(python)
    c13 = sizes(walk(lock, env, groups, set()), python)
    c12 = sizes(walk(lock, env, groups, dropped), python)
    removed = sorted(set(c13["_all"]) - set(c12["_all"]))
    out = {
        "python": python,
        "groups": list(groups),
        "lock_sha256": lock.sha256,
        "cuda13": {k: v for k, v in c13.items() if k != "_all"},
        "driver570": {k: v for k, v in c12.items() if k != "_all"},
        "driver570_removed": {"names": removed, "bytes": sum(c13["_all"][n] for n in removed)},
        "driver570_artifacts_counted_at_pypi_size": [a.name for a in pol.artifacts],
    }
    if install_json and install_json.is_file():
        inst = json.loads(install_json.read_text())
        cold = inst.get("phases", {}).get("uv-cold", {})
        if cold.get("venv"):
            out["measured_install"] = {
                "python": inst["machine"]["python"],
                "venv_apparent_bytes": cold["venv"]["apparent_bytes"],
                "note": "installed size of the cuda13 set on this machine (uv sync --locked, dev group included)",
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="3.12", help="target CPython (default 3.12, the GPU servers')")
    ap.add_argument("--group", action="append", default=[], help="dependency group of the root to include (e.g. dev)")
    ap.add_argument("--install-json", type=Path, default=None, help="install_bench.py result, for the installed size")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = report(args.python, tuple(args.group), args.install_json)
    text = json.dumps(r, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
        print(f"CPython {args.python}: cuda13 {r['cuda13']['packages']} packages, {gb(r['cuda13']['bytes'])} of wheels; "
              f"driver-570 {r['driver570']['packages']} packages, {gb(r['driver570']['bytes'])} "
              f"({len(r['driver570_removed']['names'])} CUDA 13 dists, {gb(r['driver570_removed']['bytes'])}, "
              "replaced by cudaPackages_12_8, not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
