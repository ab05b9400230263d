"""`rftstack env`: the installed stack against uv.lock and the policy.

Reads only metadata and small text files (no torch/vllm import), so it is fast and safe on any host.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import re
from pathlib import Path

from rftstack.stack import lockfile
from rftstack.stack import patches
from rftstack.stack import policy
from rftstack.stack import relax
from rftstack.errors import UserError

KEY_PACKAGES = ("trinity-rft", "vllm", "verl", "torch", "torchvision", "torchaudio", "transformers", "numpy",
                "opencv-python-headless", "ray", "flashinfer-python", "greenlet")


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    locked: str | None
    installed: str | None

    @property
    def state(self) -> str:
        if self.locked is None:
            return "extra"
        if self.installed is None:
            return "missing"
        if self.installed == self.locked:
            return "ok"
        # a local-version build of the locked release (e.g. 2.11.0+cu128 for 2.11.0) is the same release
        if self.installed.split("+", 1)[0] == self.locked:
            return "flavour"
        return "differs"


def installed_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            out.setdefault(policy.canonical(name), d.version)
    return out


def compare(locked: dict[str, str], installed: dict[str, str]) -> list[Row]:
    """Pure: one row per package in either set, sorted by name."""
    names = sorted(set(locked) | set(installed))
    return [Row(n, locked.get(n), installed.get(n)) for n in names]


def cuda_flavour(site: Path) -> dict[str, str | None]:
    """The CUDA build of torch (torch/version.py's `cuda`) and vllm (its local version tag)."""
    out: dict[str, str | None] = {"torch": None, "vllm": None}
    tv = site / "torch" / "version.py"
    if tv.is_file():
        m = re.search(r"^cuda(?::[^=]*)?=\s*'([^']*)'", tv.read_text(), re.M)
        out["torch"] = m.group(1) if m else None
    try:
        v = md.version("vllm")
        out["vllm"] = v.split("+", 1)[1] if "+" in v else "PyPI default (CUDA 13 for vllm >= 0.20)"
    except md.PackageNotFoundError:
        pass
    return out


def patch_states(sites: list[Path], pol: policy.Policy, directory: Path | None = None) -> list[dict]:
    """Per policy [[patch]], without writing: applied ("already"), "pending", "absent", or "mismatch"
    (the installed version or file is not what the patch was written for) with the reason."""
    out = []
    for p in pol.patches:
        try:
            [pp] = relax.plan_patches(sites, dataclasses.replace(pol, patches=(p,)), directory or patches.patches_dir())
            out.append({"patch": p.file, "dist": p.dist, "version": pp.version, "state": pp.state, "files": pp.files})
        except UserError as exc:
            out.append({"patch": p.file, "dist": p.dist, "version": None, "state": "mismatch", "files": [], "reason": str(exc)})
    return out


FLAVOURS = {
    "cuda13": "CUDA 13 (PyPI's builds, driver >= 580)",
    "cuda12": "CUDA 12 (policy.toml [cuda12] builds and the lock's cuda12 group, driver >= 570)",
    "mixed": "MIXED: some policy [cuda12] builds installed, some not",
    "none": "none (torch/vllm not installed)",
}


def expected(lock: lockfile.Lock, pol: policy.Policy, flavour: str) -> dict[str, str]:
    """Canonical name -> locked version the environment should hold for its flavour: the CUDA 12
    flavour adds the lock's cuda12 group and leaves out every CUDA 13-only distribution."""
    from rftstack.stack import flavours as _flavour

    groups: tuple[str, ...] = ("dev",)
    exclude: set[str] = set()
    if flavour == _flavour.CUDA12:
        groups += (_flavour.GROUP,)
        exclude = {p.name for p in lock.packages if _flavour.is_cuda13_only(p.name, pol)}
    wanted = lock.resolve(lockfile.current_environment(), groups=groups, exclude=exclude)
    return {n: p.version for n, p in wanted.items() if "virtual" not in p.source}  # a virtual root is never installed


def report(lock_path=None) -> dict:
    from rftstack.stack import flavours as _flavour

    lock = lockfile.load(lock_path)
    pol = policy.load()
    have = installed_versions()
    flav = _flavour.installed_flavour(have, pol)
    rows = compare(expected(lock, pol, flav), have)
    sites = relax.default_sites()
    plans = [relax.plan_dist(sites, dist, pol) for dist in sorted(pol.dists())]
    return {
        "lock": str(lock.path),
        "lock_sha256": lock.sha256,
        "python": lockfile.current_environment()["python_full_version"],
        "key_packages": {r.name: {"locked": r.locked, "installed": r.installed, "state": r.state}
                         for r in rows if r.name in KEY_PACKAGES},
        "cuda": cuda_flavour(sites[0]),
        "flavour": flav,
        "counts": {s: sum(1 for r in rows if r.state == s) for s in ("ok", "flavour", "differs", "missing", "extra")},
        "problems": [dataclasses.asdict(r) | {"state": r.state} for r in rows if r.state in ("differs", "missing")],
        "extra": [r.name for r in rows if r.state == "extra"],
        "policy": [{"dist": p.dist, "version": p.version, "state": p.state, "pending": p.edits} for p in plans],
        "patches": patch_states(sites, pol),
    }


def configure(parser):
    parser.add_argument("--lock", help="uv.lock to compare with (default: the project's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    try:
        rep = report(args.lock)
    except (policy.PolicyError, relax.UserError) as exc:  # relax.UserError is rftstack's when packaged
        raise UserError(str(exc)) from None
    pending = [p for p in rep["policy"] if p["state"] == relax.CHANGED]
    pending_patches = [p for p in rep["patches"] if p["state"] == relax.PENDING]
    mismatched = [p for p in rep["patches"] if p["state"] == "mismatch"]
    bad = bool(rep["problems"] or pending or pending_patches or mismatched or rep["flavour"] == "mixed")
    if args.json:
        print(json.dumps(rep | {"ok": not bad}, indent=2))
        return 1 if bad else 0
    print(f"lock    {rep['lock']} (sha256 {rep['lock_sha256'][:12]}), Python {rep['python']}")
    c = rep["counts"]
    print(f"stack   {c['ok']} as locked, {c['flavour']} other CUDA flavour, {c['differs']} different, "
          f"{c['missing']} missing, {c['extra']} not in the lock")
    for name, k in rep["key_packages"].items():
        print(f"  {name:<24} locked {k['locked'] or '-':<12} installed {k['installed'] or '-':<16} {k['state']}")
    print(f"cuda    torch built for CUDA {rep['cuda']['torch'] or '?'}; vllm build: {rep['cuda']['vllm'] or 'not installed'}")
    print(f"flavour {FLAVOURS[rep['flavour']]}")
    for p in rep["policy"]:
        state = {"applied": "relaxed as the policy wants", "absent": "not installed",
                 "changed": "NOT relaxed yet: " + "; ".join(p["pending"])}[p["state"]]
        print(f"policy  {p['dist']} {p['version'] or ''}: {state}")
    for p in rep["patches"]:
        state = {"already": "applied", "absent": "not installed", "pending": "NOT applied yet",
                 "mismatch": "CANNOT apply: " + p.get("reason", "")}[p["state"]]
        print(f"patch   {p['patch']} ({p['dist']} {p['version'] or ''}): {state}")
    for prob in rep["problems"]:
        print(f"PROBLEM {prob['name']}: locked {prob['locked']}, installed {prob['installed'] or 'nothing'}")
    if rep["problems"]:
        print("fix: run `uv sync --locked` (or reinstall the bundle) so the environment matches uv.lock")
    if pending or pending_patches:
        print("fix: run `rftstack relax` to apply the policy (relaxations, additions, patches)")
    if rep["flavour"] == "mixed":
        print("fix: run `rftstack flavour cuda12` to finish the CUDA 12 flavour, or `uv sync --locked` for the CUDA 13 one")
    if mismatched:
        print("fix: reinstall the locked versions (`uv sync --locked`), then run `rftstack relax`")
    return 1 if bad else 0
