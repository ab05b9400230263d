"""`rftstack bundle`: an offline wheel bundle of the locked stack, for air-gapped GPU servers.

    rftstack bundle build --out DIR [--python 3.12] [--platform manylinux_2_31_x86_64]
                          [--have freeze.txt] [--exclude NAME ...] [--exclude-optional-gpu]
                          [--part-size 60] [--json] [--dry-run]
    rftstack bundle verify DIR | --parts DIR ...
    rftstack bundle install DIR | --parts DIR ... [--target DIR] [--no-compile]

`build` plans from uv.lock (bundle_plan), downloads each chosen wheel by its locked URL with
resume and sha256 checks (fetch), builds wheels here for sdist-only packages and for the project
itself, cuts everything into parts of at most --part-size MiB (bundle_layout), and writes
manifest.json plus the stdlib-only installer (installer.py, as install.py) into every part.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rftstack.bundle import installer as bundle_installer
from rftstack.bundle import layout as bundle_layout
from rftstack.bundle import plan as bundle_plan
from rftstack.bundle import fetch
from rftstack.stack import lockfile
from rftstack.errors import UserError
from rftstack.bundle.progress import Progress, human_bytes

DEFAULT_PYTHON = "3.12"
# The lowest glibc the locked stack has wheels for: llguidance 1.7.6 (a vllm dependency) ships only
# manylinux_2_31. Any newer glibc (Ubuntu 22.04: 2.35, 24.04: 2.39) runs these wheels too.
DEFAULT_PLATFORM = "manylinux_2_31_x86_64"
DEFAULT_PART_MIB = 60
BUILT_HERE = "built-here"
_IGNORE_COPY = shutil.ignore_patterns(".git", ".venv", ".wheelhouse", "__pycache__", "*.pyc", "dist", "build", "result", ".pytest_cache")


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="download/build the locked wheels for a target and cut them into parts")
    b.add_argument("--out", type=Path, required=True, help="bundle directory (part-NNN/, manifest.json, install.py are written here)")
    b.add_argument("--lock", help="the project's uv.lock (default: the one next to rftstack's sources)")
    b.add_argument("--python", default=DEFAULT_PYTHON, help=f"target CPython version (default {DEFAULT_PYTHON})")
    b.add_argument("--platform", default=DEFAULT_PLATFORM, help=f"target wheel platform (default {DEFAULT_PLATFORM})")
    b.add_argument("--have", type=Path, help="the target's `pip freeze`: packages it has at the locked version are not sent")
    b.add_argument("--exclude", action="append", default=[], metavar="NAME", help="leave this distribution out (a trailing * matches a prefix); repeatable")
    b.add_argument("--exclude-optional-gpu", action="store_true", help="leave out the large optional GPU wheels a small-model serve never imports (see docs/bundle.md)")
    b.add_argument("--part-size", type=float, default=DEFAULT_PART_MIB, metavar="MIB", help=f"largest part, in MiB (default {DEFAULT_PART_MIB})")
    b.add_argument("--cache", type=Path, help="where downloads and built wheels are kept between runs (default: OUT/.files)")
    b.add_argument("--flavour", choices=[bundle_plan.CUDA12], help="cuda12: the driver-570 set (policy.toml [cuda12] builds, uv.lock's cuda12 group, no CUDA 13 library)")
    b.add_argument("--policy", help="policy file for --flavour (default: the one shipped with rftstack)")
    b.add_argument("--dry-run", action="store_true", help="print the plan, download nothing")
    b.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")

    v = sub.add_parser("verify", help="check a bundle's parts: every file and chunk present with its sha256")
    bundle_installer.configure(v)
    i = sub.add_parser("install", help="verify, reassemble and pip-install a bundle into this interpreter (or --target)")
    bundle_installer.configure(i)


def run(args) -> int:
    if args.bundle_command == "build":
        return build_command(args)
    if args.bundle_command == "verify":
        args.verify_only = True
    return bundle_installer.run(args)


# ------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"bundle: {msg}", file=sys.stderr, flush=True)


def exclusions(args) -> list[str]:
    patterns = list(args.exclude)
    if args.exclude_optional_gpu:
        patterns += bundle_plan.load_presets()["optional-gpu"]["packages"]
    return patterns


def read_have(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        return bundle_plan.parse_freeze(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read --have {path} ({exc.strerror}); pass the file holding the target's `pip freeze`") from None


def is_pure(wheel_name: str) -> bool:
    from packaging.utils import parse_wheel_filename

    _, _, _, tags = parse_wheel_filename(wheel_name)
    return all(t.interpreter.startswith("py") and t.abi == "none" and t.platform == "any" for t in tags)


REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip entry can carry


def build_wheel(src: Path, out_dir: Path, what: str) -> Path:
    """Build one wheel from a source tree or sdist with `uv build` (or pip wheel); returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    src, out_dir = src.resolve(), out_dir.resolve()  # the builder runs in out_dir: relative paths would dangle
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "build", "--wheel", "--quiet", "--no-config", "--out-dir", str(out_dir), str(src)]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out_dir), str(src)]
    # fixed file times in the wheel (setuptools and hatchling honour SOURCE_DATE_EPOCH): without it,
    # every build of the same sdist gets a new hash, and so does the bundle
    env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", REPRODUCIBLE_EPOCH)}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out_dir, env=env)
    wheels = sorted(out_dir.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UserError(f"building a wheel of {what} failed ({' / '.join(tail) or 'no wheel written'}); build it by hand or --exclude it", 1)
    return wheels[0]


def build_sdist_wheel(item: bundle_plan.Item, sdist: Path, cache: Path) -> Path:
    """A pure-Python wheel from a locked sdist, cached by the sdist's hash (so rebuilds are stable)."""
    out = cache / "built" / item.artifact.sha256[:32]
    done = sorted(out.glob("*.whl")) if out.is_dir() else []
    if len(done) == 1:
        return done[0]
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    try:
        wheel = build_wheel(sdist, tmp, f"{item.name} {item.version} (sdist only in uv.lock)")
        if not is_pure(wheel.name):
            raise UserError(
                f"the sdist of {item.name} {item.version} built {wheel.name}, which is not a pure-Python (py3-none-any) wheel "
                f"and may not run on the target; build it on a machine like the target, or --exclude {item.name}",
                1,
            )
        return _keep(wheel, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep(wheel: Path, out: Path) -> Path:
    """Move a freshly built wheel into ``out``, which then holds that wheel alone."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return Path(shutil.move(str(wheel), out / wheel.name))


def build_project_wheel(project: Path, cache: Path) -> Path:
    """The root project as a wheel, built from a copy of its tree (the source tree stays untouched)."""
    if not (project / "pyproject.toml").is_file():
        raise UserError(f"{project} has no pyproject.toml, so the project of {project / 'uv.lock'} cannot be built; pass --lock from the project directory")
    tmp = Path(tempfile.mkdtemp(prefix="project-", dir=cache))
    try:
        src = tmp / "src"
        shutil.copytree(project, src, ignore=_IGNORE_COPY, symlinks=True)
        wheel = build_wheel(src, tmp / "dist", f"the project in {project}")
        return _keep(wheel, cache / "project")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gather(items: list[bundle_plan.Item], lock: lockfile.Lock, cache: Path) -> list[dict]:
    """Download / build every item to send; returns the manifest's file entries with local paths."""
    send = [i for i in items if i.status == bundle_plan.SEND]
    downloads = [i for i in send if i.artifact is not None]
    total = sum(i.size for i in downloads)
    _log(f"fetching {len(downloads)} files ({human_bytes(total)}) into {cache}")
    progress = Progress(total)
    lock_versions = {p.name: p.version for p in lock.packages}
    files: list[dict] = []
    for n, item in enumerate(downloads, 1):
        art = item.artifact
        dest = cache / ("sdist" if item.kind == bundle_plan.SDIST else "wheels") / art.filename
        progress.set_label(art.filename)
        source = "uv.lock" if item.version == lock_versions.get(item.name) else "policy.toml"
        state = fetch.download(art.url, dest, art.sha256, art.size, advance=progress.advance, source=source)
        if state == fetch.PRESENT:
            progress.skip(art.size or 0)
        progress.note(f"[{n}/{len(downloads)}] {art.filename} {human_bytes(art.size or 0)} {state}, sha256 ok")
        if item.kind == bundle_plan.SDIST:
            wheel = build_sdist_wheel(item, dest, cache)
            progress.note(f"built {wheel.name} from {art.filename} (pure Python)")
            files.append(_entry(item, wheel, BUILT_HERE, built_from={"url": art.url, "sha256": art.sha256}))
        else:
            files.append(_entry(item, dest, art.url, sha256=art.sha256))
    progress.close()
    for item in send:
        if item.kind == bundle_plan.PROJECT:
            wheel = build_project_wheel(lock.path.resolve().parent, cache)
            _log(f"built {wheel.name} from {lock.path.resolve().parent}")
            files.append(_entry(item, wheel, BUILT_HERE))
    return sorted(files, key=lambda f: f["name"])


def _entry(item: bundle_plan.Item, path: Path, source: str, sha256: str | None = None, built_from: dict | None = None) -> dict:
    e = {
        "name": path.name,
        "dist": item.name,
        "version": item.version,
        "kind": item.kind,
        "sha256": sha256 or fetch.sha256_file(path),
        "size": path.stat().st_size,
        "source": source,
        "path": str(path),
    }
    if built_from:
        e["built_from"] = built_from
    return e


def _copy_range(src: Path, dst: Path, offset: int, size: int) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fi.seek(offset)
        left = size
        while left:
            block = fi.read(min(1 << 20, left))
            if not block:
                raise UserError(f"{src} is shorter than its manifest entry; delete it and run build again", 1)
            fo.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def _place_whole(src: Path, dst: Path) -> None:
    # A copy, not a hard link: a part edited or damaged later must not change the cache.
    shutil.copyfile(src, dst)


def _manifest(files: list[dict], layout: list[list[bundle_layout.Piece]], piece_hash: dict[str, str], meta: dict) -> dict:
    where: dict[str, list[tuple[str, bundle_layout.Piece]]] = {}
    for n, part in enumerate(layout):
        for piece in part:
            where.setdefault(piece.file, []).append((f"part-{n:03d}", piece))
    out = []
    for f in files:
        placed = sorted(where[f["name"]], key=lambda x: x[1].offset)
        e = {k: v for k, v in f.items() if k != "path"}
        e["parts"] = sorted({p for p, _ in placed})
        if placed[0][1].chunk is not None:
            e["chunks"] = [{"name": pc.name, "part": p, "offset": pc.offset, "size": pc.size, "sha256": piece_hash.get(pc.name, "0" * 64)} for p, pc in placed]
        out.append(e)
    parts = [{"name": f"part-{n:03d}", "pieces": len(part), "bytes": sum(pc.size for pc in part)} for n, part in enumerate(layout)]
    ident = hashlib.sha256(json.dumps([meta, [(f["name"], f["sha256"]) for f in files]], sort_keys=True).encode()).hexdigest()
    return {"format": bundle_installer.FORMAT, "schema": bundle_installer.SCHEMA, "bundle_id": ident, **meta, "parts": parts, "files": out}


def _dump(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def write_parts(files: list[dict], out: Path, limit: int, meta: dict) -> dict:
    """Cut ``files`` into out/part-NNN (each at most ``limit`` bytes, manifest and installer
    included); returns the manifest."""
    installer = Path(bundle_installer.__file__).read_bytes()
    sizes = [(f["name"], f["size"]) for f in files]
    overhead = len(installer) + 4096
    while True:
        capacity = limit - overhead
        if capacity < 8 * 1024:
            raise UserError(f"--part-size {limit / 2**20:.3g} MiB leaves no room next to the installer and manifest ({human_bytes(overhead)}); pass a larger --part-size")
        layout = bundle_layout.pack(sizes, capacity)
        need = len(installer) + len(_dump(_manifest(files, layout, {}, meta)))
        if need <= overhead:
            break
        overhead = need + 1024
    for old in out.glob("part-*"):
        if old.is_dir() and bundle_installer.PART_RE.match(old.name):
            shutil.rmtree(old)
    by_name = {f["name"]: f for f in files}
    piece_hash: dict[str, str] = {}
    _log(f"writing {len(layout)} parts of at most {human_bytes(limit)} into {out}")
    for n, part in enumerate(layout):
        d = out / f"part-{n:03d}"
        d.mkdir(parents=True)
        for piece in sorted(part, key=lambda p: p.name):
            src = Path(by_name[piece.file]["path"])
            if piece.chunk is None:
                _place_whole(src, d / piece.name)
            else:
                piece_hash[piece.name] = _copy_range(src, d / piece.name, piece.offset, piece.size)
    manifest = _manifest(files, layout, piece_hash, meta)
    data = _dump(manifest)
    for n in range(len(layout)):
        d = out / f"part-{n:03d}"
        (d / bundle_installer.MANIFEST).write_bytes(data)
        (d / bundle_installer.INSTALLER).write_bytes(installer)
        total = sum(p.stat().st_size for p in d.iterdir())
        if total > limit:  # the packing above makes this impossible; a bug if it happens
            raise RuntimeError(f"{d} holds {total} bytes, over the part size {limit}")
    (out / bundle_installer.MANIFEST).write_bytes(data)
    (out / bundle_installer.INSTALLER).write_bytes(installer)
    return manifest


def build(args) -> dict:
    lock = lockfile.load(args.lock)
    target = bundle_plan.parse_target(args.python, args.platform)
    patterns = exclusions(args)
    flavour = getattr(args, "flavour", None)
    pol = None
    if flavour:
        from rftstack.stack import policy

        try:
            pol = policy.load(getattr(args, "policy", None))
        except policy.PolicyError as exc:
            raise UserError(str(exc)) from None
    items = bundle_plan.plan(lock, target, have=read_have(args.have), exclude=patterns, flavour=flavour, pol=pol)
    summary = {
        "flavour": flavour or "cuda13",
        "target": target.as_dict(),
        "lock": str(lock.path),
        "lock_sha256": lock.sha256,
        "excluded_patterns": patterns,
        "sent": [i.as_dict() for i in items if i.status == bundle_plan.SEND],
        "present": [i.as_dict() for i in items if i.status == bundle_plan.PRESENT],
        "excluded": [i.as_dict() for i in items if i.status == bundle_plan.EXCLUDED],
    }
    unused = [p for p in args.exclude if not any(bundle_plan.excluded_by(i.name, [p]) for i in items)]
    if unused:
        _log(f"--exclude {', '.join(unused)} matched nothing the target installs")
    if args.dry_run:
        summary["dry_run"] = True
        return summary
    if args.part_size <= 0:
        raise UserError(f"--part-size {args.part_size} is not a positive number of MiB; pass e.g. 60")
    out = args.out
    cache = args.cache or out / ".files"
    try:
        out.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        files = gather(items, lock, cache)
        meta = {
            "flavour": flavour or "cuda13",
            "target": target.as_dict(),
            "lock_sha256": lock.sha256,
            "part_size_mib": args.part_size,
            "excluded": sorted(i.name for i in items if i.status == bundle_plan.EXCLUDED),
            "excluded_patterns": patterns,
            "present": sorted(f"{i.name}=={i.version}" for i in items if i.status == bundle_plan.PRESENT),
        }
        manifest = write_parts(files, out, int(args.part_size * 2**20), meta)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise fetch.disk_full(out / "x") from None
        raise
    summary.update(
        out=str(out),
        bundle_id=manifest["bundle_id"],
        parts=len(manifest["parts"]),
        files=len(manifest["files"]),
        total_bytes=sum(f["size"] for f in manifest["files"]),
        built_here=[f["name"] for f in manifest["files"] if f["source"] == BUILT_HERE],
    )
    return summary


def render(summary: dict) -> str:
    lines = [f"target: CPython {summary['target']['python']} on {summary['target']['platform']}; lock {summary['lock']} (sha256 {summary['lock_sha256'][:12]})"]
    for key, title in (("excluded", "excluded"), ("present", "already on the target (not sent)"), ("sent", "sent")):
        rows = summary[key]
        size = sum(r["size"] for r in rows)
        lines.append(f"{title}: {len(rows)} packages" + (f", {human_bytes(size)} as locked" if size else ""))
        for r in rows:
            extra = r.get("reason") or (f"{r['kind']}, {human_bytes(r['size'])}" if r["kind"] != "project" else "project, built here")
            lines.append(f"  {r['name']} {r['version']} ({extra})")
    if "parts" in summary:
        lines.append(f"bundle {summary['bundle_id'][:12]}: {summary['files']} files, {human_bytes(summary['total_bytes'])} in {summary['parts']} parts under {summary['out']}")
        if summary["built_here"]:
            lines.append(f"built here: {', '.join(summary['built_here'])}")
        lines.append(f"install on the target: python3 {summary['out']}/part-000/install.py  (or: python3 install.py --parts DIR1 DIR2 ...)")
    return "\n".join(lines)


def build_command(args) -> int:
    summary = build(args)
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0
