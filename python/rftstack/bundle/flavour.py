"""`rftstack flavour cuda12`: turn a synced (CUDA 13) environment into the driver-570 flavour.

    rftstack flavour cuda12 [--python PY] [--from DIR] [--cache DIR] [--dry-run] [--json]
    rftstack flavour restore BACKUP [--json]

From the same policy as the flake: the CUDA 12 builds of policy.toml [cuda12] (torch 2.11.0+cu128,
torchvision, torchaudio, vllm 0.23.0+cu129) by URL and sha256 (size too where the policy has it),
and the CUDA 12.8 runtime libraries from uv.lock's `cuda12` group (nvidia-*-cu12, sha256 and
size from the lock), in place of the CUDA 13 builds; every CUDA 13 distribution ([[cuda12.drop]],
`*-cu13`) removed; the policy's [[cuda12.rewrite]] applied with `relax` so `pip check` stays clean.

Staged, so a failure leaves the environment as it was: (1) plan from installed metadata; (2) fetch
and verify every file; (3) check that the requirements of what will be installed and of what stays
hold after the swap; only then (4) move the files of every distribution to be removed into a
backup folder under the environment's prefix, (5) install the new wheels (`uv pip install
--no-deps --no-index`, or pip), (6) relax, (7) verify (no CUDA 13 ELF dependency left, no new
`pip check` line). A failure in 5-7 uninstalls what was installed and moves the backup back; if
that fails too, the sentence names `rftstack flavour restore BACKUP`. Running it again when the
environment is already the CUDA 12 flavour does nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from rftstack.bundle import fetch
from rftstack.stack import lockfile, policy, relax
from rftstack.stack.flavours import CUDA12, GROUP, installed_flavour, is_cuda13_only  # noqa: F401 - installed_flavour re-exported
from rftstack.errors import UserError
from rftstack.bundle.progress import Progress, human_bytes

BACKUP_DIR = ".rftstack-flavour-backup"
MOVED = "moved.json"
CACHE_DIR = ".rftstack-flavour-cache"  # default download cache, under the prefix; kept after a failure (resume), removed after success
NOTHING_TO_DO = "nothing to do"

_PROBE = r"""
import json, os, platform, sys, sysconfig
p = sysconfig.get_paths()
iv = sys.implementation.version
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "version": list(sys.version_info[:2]),
    "sites": list(dict.fromkeys([p["purelib"], p["platlib"]])),
    "markers": {
        "implementation_name": sys.implementation.name,
        "implementation_version": f"{iv.major}.{iv.minor}.{iv.micro}",
        "os_name": os.name, "platform_machine": platform.machine(),
        "platform_python_implementation": platform.python_implementation(),
        "platform_release": platform.release(), "platform_system": platform.system(),
        "platform_version": platform.version(), "python_full_version": platform.python_version(),
        "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
    },
}))
"""


# ------------------------------------------------------------------------------------------------
# The target environment
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    python: str
    prefix: Path
    version: tuple[int, int]
    sites: tuple[Path, ...]
    markers: dict

    @property
    def python_tag(self) -> str:
        return f"cp{self.version[0]}{self.version[1]}"


def probe(python: str | None) -> Target:
    exe = python or sys.executable
    try:
        out = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise UserError(f"cannot run --python {exe} ({exc.strerror}); pass the environment's python (e.g. .venv/bin/python)") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"--python {exe} did not run ({last}); pass the environment's python (e.g. .venv/bin/python)")
    d = json.loads(out.stdout)
    return Target(d["executable"], Path(d["prefix"]), tuple(d["version"]), tuple(Path(s) for s in d["sites"]), d["markers"])


def installed(target: Target) -> dict[str, md.Distribution]:
    """Canonical name -> distribution, from the target's site directories (first wins)."""
    out: dict[str, md.Distribution] = {}
    for d in md.distributions(path=[str(s) for s in target.sites]):
        name = d.metadata["Name"]
        if name:
            out.setdefault(policy.canonical(name), d)
    return out


def supported_tags(target: Target) -> set:
    from packaging import tags

    plats = list(tags.platform_tags())  # the same machine: its glibc decides the manylinux tags
    return set(tags.cpython_tags(target.version, platforms=plats)) | set(tags.compatible_tags(target.version, target.python_tag, plats))


def fits(filename: str, supported: set) -> bool:
    from packaging.utils import parse_wheel_filename

    return bool(set(parse_wheel_filename(filename)[3]) & supported)


# ------------------------------------------------------------------------------------------------
# The plan: pure decisions over installed versions
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Wheel:
    name: str  # canonical
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None
    source: str  # "policy.toml" or "uv.lock": where its hash comes from

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Plan:
    install: list[Wheel]
    remove: list[tuple[str, str]]  # (canonical name, installed version): CUDA 13 builds and what the wheels replace
    already: list[str]

    @property
    def empty(self) -> bool:
        return not self.install and not self.remove


def policy_wheels(pol: policy.Policy, supported: set, target: Target) -> list[Wheel]:
    out = []
    for a in pol.artifacts:
        if not fits(a.filename, supported):
            raise UserError(
                f"the policy's CUDA 12 build {a.filename} does not run on CPython {target.version[0]}.{target.version[1]} here "
                f"(it is for {pol.cuda12.get('python', '?')}); make the environment with Python 3.12 (`uv sync --locked --python 3.12`)"
            )
        out.append(Wheel(policy.canonical(a.name), a.version, a.filename, a.url, a.sha256, a.size, pol.path.name))
    return out


def runtime_wheels(lock: lockfile.Lock, target: Target, supported: set) -> list[Wheel]:
    """The lock's cuda12 group and what it pulls, each as the lock's wheel for this target."""
    pkgs = lock.group(target.markers, GROUP)
    if not pkgs:
        raise UserError(f"{lock.path} has no `{GROUP}` dependency group; use the project's uv.lock (run `uv lock` after pulling)")
    out = []
    for pkg in pkgs.values():
        art = next((w for w in pkg.wheels if fits(w.filename, supported)), None)
        if art is None:
            raise UserError(f"{lock.path} has no wheel of {pkg.name} {pkg.version} for this machine; run on x86-64 Linux")
        out.append(Wheel(pkg.name, pkg.version, art.filename, art.url, art.sha256, art.size, "uv.lock"))
    return sorted(out, key=lambda w: w.name)


def decide(have: dict[str, str], artifacts: list[Wheel], artifact_replaces: dict[str, str], runtime: list[Wheel], pol: policy.Policy) -> Plan:
    """What to install and remove, from the installed versions ``have`` (canonical name -> version)."""
    install: list[Wheel] = []
    remove: list[tuple[str, str]] = []
    already: list[str] = []
    for w in artifacts:
        v = have.get(w.name)
        if v == w.version:
            already.append(f"{w.name} {v}")
        elif v is None:
            raise UserError(f"{w.name} is not installed in this environment; sync it first (`uv sync --locked`), then run `rftstack flavour cuda12`")
        elif v == artifact_replaces[w.name]:
            install.append(w)
            remove.append((w.name, v))
        else:
            raise UserError(
                f"{w.name} {v} is installed, but the policy's {w.version} replaces {artifact_replaces[w.name]}; "
                f"reinstall the locked stack (`uv sync --locked`), then run `rftstack flavour cuda12`"
            )
    for w in runtime:
        v = have.get(w.name)
        if v == w.version:
            already.append(f"{w.name} {v}")
            continue
        install.append(w)
        if v is not None:
            remove.append((w.name, v))
    for name in sorted(have):
        if is_cuda13_only(name, pol) and (name, have[name]) not in remove:
            remove.append((name, have[name]))
    return Plan(install, sorted(remove), already)


def plan(pol: policy.Policy, lock: lockfile.Lock, target: Target, dists: dict[str, md.Distribution]) -> Plan:
    supported = supported_tags(target)
    artifacts = policy_wheels(pol, supported, target)
    replaces = {policy.canonical(a.name): a.replaces for a in pol.artifacts}
    return decide({n: d.version for n, d in dists.items()}, artifacts, replaces, runtime_wheels(lock, target, supported), pol)


# ------------------------------------------------------------------------------------------------
# Fetch and verify
# ------------------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"flavour: {msg}", file=sys.stderr, flush=True)


def fetch_all(wheels: list[Wheel], cache: Path, from_dir: Path | None, retries: int) -> dict[str, Path]:
    """Every wheel as a local file whose size and sha256 were checked; nothing is installed yet."""
    out: dict[str, Path] = {}
    if from_dir is not None:
        for w in wheels:
            path = from_dir / w.filename
            if not path.is_file():
                raise UserError(f"--from {from_dir} has no {w.filename}; put the file there (from {w.url}) or leave --from out to download it")
            if w.size is not None and path.stat().st_size != w.size:
                raise UserError(f"{path} is {path.stat().st_size} bytes, but {w.source} says {w.size} (a truncated or wrong file); fetch it again from {w.url}", 1)
            digest = fetch.sha256_file(path)
            if digest != w.sha256:
                raise UserError(f"{path} has sha256 {digest}, but {w.source} says {w.sha256}; the file is not the one the {w.source} names, fetch it again from {w.url}", 1)
            out[w.filename] = path
        return out
    total = sum(w.size or 0 for w in wheels)
    _log(f"fetching {len(wheels)} files ({human_bytes(total)} known in advance) into {cache}")
    progress = Progress(total)
    try:
        for n, w in enumerate(wheels, 1):
            progress.set_label(w.filename)
            state = fetch.download(w.url, cache / w.filename, w.sha256, w.size, advance=progress.advance, retries=retries, source=w.source)
            if w.size is None:  # the policy gives no size: count the file once it is here
                progress.total += (cache / w.filename).stat().st_size
            if state == fetch.PRESENT:
                progress.skip((cache / w.filename).stat().st_size)
            progress.note(f"[{n}/{len(wheels)}] {w.filename} {state}, sha256 ok")
            out[w.filename] = cache / w.filename
    finally:
        progress.close()
    return out


# ------------------------------------------------------------------------------------------------
# Requirements after the swap (what `pip check` will say), checked before anything changes
# ------------------------------------------------------------------------------------------------


def wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        meta = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise UserError(f"{path.name} has no .dist-info/METADATA, so it is not a wheel; fetch it again", 1)
        msg = HeaderParser().parsestr(z.read(meta).decode("utf-8"))
    return msg.get_all("Requires-Dist") or []


def _rewritten(requires: list[str], name: str, version: str, pol: policy.Policy) -> list[str]:
    rules = [r for r in pol.rewrites if policy.canonical(r.dist) == name and r.version == version]
    out = []
    for req in requires:
        head, _, marker = req.partition(";")
        rule = next((r for r in rules if policy.requirement_name(head) == policy.canonical(r.requirement) and "extra" not in marker), None)
        if rule is None:
            out.append(req)
        else:
            out += [n + (f"; {marker.strip()}" if marker.strip() else "") for n in rule.now]
    return out


def unmet(after: dict[str, str], requires: dict[str, list[str]], markers: dict) -> list[str]:
    """Pure: "X v requires R, but ..." for each requirement (extras aside) ``after`` does not meet."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for who, reqs in sorted(requires.items()):
        for line in reqs:
            try:
                r = Requirement(line)
            except InvalidRequirement:
                continue
            if r.marker is not None and not r.marker.evaluate(markers | {"extra": ""}):
                continue
            have = after.get(policy.canonical(r.name))
            if have is None:
                out.append(f"{who} requires {line.split(';')[0].strip()}, which the swap leaves uninstalled")
            elif not r.specifier.contains(have, prereleases=True):
                out.append(f"{who} requires {line.split(';')[0].strip()}, but the swap leaves {r.name} {have}")
    return out


def check_requirements(p: Plan, files: dict[str, Path], dists: dict[str, md.Distribution], target: Target, pol: policy.Policy) -> None:
    removed = {n for n, _ in p.remove}
    after = {n: d.version for n, d in dists.items() if n not in removed} | {w.name: w.version for w in p.install}
    requires: dict[str, list[str]] = {}
    for w in p.install:
        requires[f"{w.name} {w.version}"] = _rewritten(wheel_requires(files[w.filename]), w.name, w.version, pol)
    for n, d in dists.items():
        if n in removed:
            continue
        reqs = d.requires or []
        if any(policy.requirement_name(r) in removed for r in reqs):  # only what the swap can break
            requires[f"{n} {d.version}"] = [r for r in reqs if policy.requirement_name(r) in removed]
    problems = unmet(after, requires, target.markers)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UserError(
            f"after the swap {'; '.join(problems[:3])}{more}; nothing was changed: update the lock's `{GROUP}` group "
            f"or policy.toml [[cuda12.rewrite]] to match these builds",
            1,
        )


# ------------------------------------------------------------------------------------------------
# The transaction: back up, install, relax, verify; undo on failure
# ------------------------------------------------------------------------------------------------


def _files_of(dist: md.Distribution) -> list[Path]:
    """Every file RECORD lists that exists, plus anything else in its .dist-info folder."""
    out: list[Path] = []
    dist_info: Path | None = None
    for f in dist.files or ():
        path = Path(os.path.normpath(dist.locate_file(f)))
        if str(f).endswith(".dist-info/RECORD"):
            dist_info = path.parent
        if (path.is_file() or path.is_symlink()) and path not in out:
            out.append(path)
    if dist_info is not None and dist_info.is_dir():
        out += [p for p in sorted(dist_info.rglob("*")) if (p.is_file() or p.is_symlink()) and p not in out]
    return out


def back_up(dists: list[md.Distribution], target: Target) -> Path:
    """Move every file of ``dists`` under ``prefix/BACKUP_DIR/<time>/``; returns that folder.

    moved.json (written before the first move) maps each original path to its backup path; a
    failure half-way moves back what was moved."""
    root = target.prefix / BACKUP_DIR / time.strftime("%Y%m%d-%H%M%S")
    n = 0
    while root.exists():
        n += 1
        root = root.with_name(root.name.split(".")[0] + f".{n}")
    root.mkdir(parents=True)
    pairs = []
    for d in dists:
        for i, src in enumerate(_files_of(d)):
            pairs.append([str(src), str(root / "files" / policy.canonical(d.metadata["Name"]) / f"{i:06d}-{src.name}")])
    (root / MOVED).write_text(json.dumps({"python": target.python, "moved": pairs}, indent=0))
    try:
        for src, dst in pairs:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    except BaseException as exc:
        restore(root)
        shutil.rmtree(root, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UserError(f"moving the CUDA 13 files aside under {root.parent} failed ({exc.strerror}); nothing was changed, "
                            f"free space or fix the permissions and run the same command again", 1) from None
        raise
    for src, _ in pairs:  # prune directories the move left empty (namespace packages would see them)
        parent = Path(src).parent
        while parent not in target.sites and parent != target.prefix:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    return root


def restore(backup: Path) -> int:
    """Move a backup's files back where they were; returns how many moved. Idempotent."""
    try:
        data = json.loads((backup / MOVED).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{backup} is not a flavour backup ({exc}); pass the folder named in the failure message") from None
    n = 0
    for src, dst in data["moved"]:
        if Path(dst).exists() or Path(dst).is_symlink():
            Path(src).parent.mkdir(parents=True, exist_ok=True)
            os.replace(dst, src)
            n += 1
    return n


def installer(target: Target) -> list[str]:
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", target.python, "--no-deps", "--no-index", "--no-config"]
    return [target.python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check"]


def pip_check(target: Target) -> list[str]:
    uv = shutil.which("uv")
    cmd = [uv, "pip", "check", "--python", target.python] if uv else [target.python, "-m", "pip", "check"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 0:
        return []
    lines = [l.strip() for l in (out.stdout + out.stderr).splitlines() if l.strip()]
    return [l for l in lines if not l.startswith(("Checked ", "Found ", "Using Python"))]


def cuda13_left(target: Target, keep=None) -> list[str]:
    """Distributions of the target whose ELF files need a CUDA 13 library (``keep``: only those names)."""
    from rftstack.stack import elf

    dists = [d for d in md.distributions(path=[str(s) for s in target.sites])
             if keep is None or policy.canonical(d.metadata["Name"] or "") in keep]
    return [f"{d.dist} {d.version} ({d.example} needs {d.lib})" for d in elf.scan(dists) if d.cuda_major >= 13]


def check_staying(p: Plan, dists: dict[str, md.Distribution], target: Target) -> None:
    """Refuse, before anything changes, when a distribution the swap keeps needs CUDA 13."""
    removed = {n for n, _ in p.remove}
    left = cuda13_left(target, keep={n for n in dists if n not in removed})
    if left:
        raise UserError(f"{', '.join(left[:3])} would still need CUDA 13 after the swap and the policy has no CUDA 12 build of it; "
                        f"nothing was changed: uninstall it, or add it to policy.toml [[cuda12.drop]]", 1)


def _uninstall(names: list[str], target: Target) -> None:
    uv = shutil.which("uv")
    cmd = [uv, "pip", "uninstall", "--python", target.python, *names] if uv else [target.python, "-m", "pip", "uninstall", "-y", *names]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError((out.stderr or out.stdout).strip().splitlines()[-1:] or "uninstall failed")


def swap(p: Plan, files: dict[str, Path], dists: dict[str, md.Distribution], target: Target, pol: policy.Policy) -> dict:
    before_check = set(pip_check(target))
    backup = back_up([dists[n] for n, _ in p.remove], target)
    _log(f"moved {len(p.remove)} distributions aside into {backup}")
    try:
        _log(f"installing {len(p.install)} wheels into {target.prefix}")
        cmd = installer(target) + [str(files[w.filename]) for w in p.install]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            tail = " / ".join((out.stderr or out.stdout).strip().splitlines()[-2:])
            raise UserError(f"installing the CUDA 12 wheels failed ({tail})", 1)
        plans = relax.plan_rewrites(list(target.sites), pol)
        for rp in plans:
            relax.apply(rp)
        _log("checking: ELF dependencies of the environment, `pip check`")
        left = cuda13_left(target)
        if left:
            raise UserError(f"after the swap {', '.join(left[:3])} still need CUDA 13, so a CUDA 12 build is not what the policy says it is; "
                            f"check the file's source (or policy.toml)", 1)
        new_lines = [l for l in pip_check(target) if l not in before_check]
        if new_lines:
            raise UserError(f"after the swap `pip check` says: {'; '.join(new_lines[:3])}", 1)
    except BaseException as exc:
        undo = "the environment was put back as it was"
        try:
            _uninstall(sorted({w.name for w in p.install}), target)
            restore(backup)
            shutil.rmtree(backup, ignore_errors=True)
        except Exception as undo_exc:  # noqa: BLE001 - report both failures in one sentence
            undo = (f"putting the environment back failed too ({undo_exc}): run `rftstack flavour restore {backup} --python {target.python}` "
                    f"(moves the removed files back), or `uv sync --locked` in the project")
        if isinstance(exc, UserError):
            raise UserError(f"{exc}; {undo}", exc.exit_code) from None
        raise
    shutil.rmtree(backup, ignore_errors=True)
    return {"rewrites": [e for rp in plans for e in rp.edits], "pip_check_new": []}


# ------------------------------------------------------------------------------------------------
# Which flavour is installed (for `rftstack env`)
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="flavour_command", metavar="FLAVOUR", required=True)
    c = sub.add_parser(CUDA12, help="swap in the policy's CUDA 12 builds (driver 570) and the lock's CUDA 12 runtime libraries")
    c.add_argument("--python", help="the environment's python (default: the one running rftstack)")
    c.add_argument("--from", dest="from_dir", type=Path, metavar="DIR", help="take the files from DIR (pre-downloaded) instead of downloading; each is size- and sha256-checked")
    c.add_argument("--cache", type=Path, help=f"where downloads are kept (default: PREFIX/{CACHE_DIR}, removed after a successful swap)")
    c.add_argument("--lock", help="the project's uv.lock (default: the one next to rftstack's sources)")
    c.add_argument("--policy", help="policy file (default: the one shipped with rftstack)")
    c.add_argument("--retries", type=int, default=4, help="download attempts after the first (default 4)")
    c.add_argument("--dry-run", action="store_true", help="print the plan, change and download nothing")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    r = sub.add_parser("restore", help="move back the files a failed swap moved aside (the folder its message names)")
    r.add_argument("backup", type=Path)
    r.add_argument("--json", action="store_true", help="print the result as JSON")


def run_cuda12(args) -> dict:
    try:
        pol = policy.load(args.policy)
    except policy.PolicyError as exc:
        raise UserError(str(exc)) from None
    lock = lockfile.load(args.lock)
    target = probe(args.python)
    dists = installed(target)
    p = plan(pol, lock, target, dists)
    pending_rewrites = [rp for rp in relax.plan_rewrites(list(target.sites), pol) if rp.new_metadata is not None]
    result = {
        "flavour": CUDA12, "python": target.python, "prefix": str(target.prefix),
        "install": [w.as_dict() for w in p.install], "remove": [f"{n} {v}" for n, v in p.remove], "already": p.already,
    }
    if p.empty and not pending_rewrites:
        left = cuda13_left(target)
        return result | {"state": NOTHING_TO_DO, "cuda13_left": left}
    check_staying(p, dists, target)
    if args.dry_run:
        return result | {"state": "dry run"}
    cache = args.cache or target.prefix / CACHE_DIR
    files = fetch_all(p.install, cache, args.from_dir, args.retries) if p.install else {}
    check_requirements(p, files, dists, target, pol)
    if p.empty:  # only the metadata rewrites are pending
        for rp in pending_rewrites:
            relax.apply(rp)
        done = {"rewrites": [e for rp in pending_rewrites for e in rp.edits]}
    else:
        done = swap(p, files, dists, target, pol)
    if args.cache is None and args.from_dir is None:  # the default cache lives in the environment: GBs nobody needs now
        shutil.rmtree(cache, ignore_errors=True)
    return result | done | {"state": "swapped", "cuda13_left": cuda13_left(target), "next": "rftstack relax"}


def render(r: dict) -> str:
    if r["state"] == NOTHING_TO_DO:
        return f"{r['prefix']} is the CUDA 12 flavour already ({len(r['already'])} distributions as the policy and lock want): nothing to do"
    lines = [f"{'would install' if r['state'] == 'dry run' else 'installed'}: " + ", ".join(f"{w['name']} {w['version']}" for w in r["install"])]
    lines.append(f"{'would remove' if r['state'] == 'dry run' else 'removed'}: " + (", ".join(r["remove"]) or "nothing"))
    for e in r.get("rewrites", []):
        lines.append(f"relaxed: {e}")
    if r["state"] != "dry run":
        lines.append(f"{r['prefix']} is now the CUDA 12 flavour (driver >= 570); next run `rftstack relax` from it (the policy's patches "
                     f"for the new torch), and run the stack from it directly (`.venv/bin/rftstack ...`), since `uv sync` installs the lock's default (CUDA 13) set")
    return "\n".join(lines)


def run(args) -> int:
    if args.flavour_command == "restore":
        n = restore(args.backup)
        r = {"restored": n, "backup": str(args.backup)}
        print(json.dumps(r) if args.json else f"moved {n} files back from {args.backup}")
        return 0
    r = run_cuda12(args)
    print(json.dumps(r, indent=2) if args.json else render(r))
    return 0
