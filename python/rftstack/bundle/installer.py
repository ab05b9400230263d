"""Install an offline rftstack wheel bundle: verify, reassemble, pip install, relax, pip check.

Standard library only, and no import of rftstack: `rftstack bundle build` copies this file
verbatim into every bundle part as `install.py`, to be run by the target's bare Python (which
only needs pip). `rftstack bundle install` and `rftstack bundle verify` run the same code. So it
keeps its own copies of helpers the package has elsewhere (sha256 of a file, name canonicalisation).

    python3 /tmp/wh/part-000/install.py                     # finds the sibling part-NNN dirs
    python3 install.py --parts /tmp/wh/part-000 /tmp/wh/part-001 ...
    python3 install.py BUNDLE_DIR --target /opt/site --no-compile

Nothing is installed unless every file and chunk the manifest names is present with its hash.
Exit codes: 0 installed and `pip check` clean (apart from what the build excluded on purpose),
2 bundle incomplete, damaged or not for this Python, 3 installed but relax or `pip check` failed,
4 pip install failed.
"""

from __future__ import annotations

import argparse
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MANIFEST = "manifest.json"
INSTALLER = "install.py"
FORMAT = "rftstack-bundle"
SCHEMA = 1
PART_RE = re.compile(r"^part-\d{3,}$")
_BLOCK = 1 << 20


class BundleError(Exception):
    """One sentence per problem (``problems``), exit code ``exit_code``; nothing was installed."""

    def __init__(self, problems, exit_code: int = 2):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(" ".join(self.problems))
        self.exit_code = exit_code


def sha256_file(path, start: int = 0, length: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left is None or left > 0:
            block = f.read(_BLOCK if left is None else min(_BLOCK, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------------------------
# Finding the parts
# ------------------------------------------------------------------------------------------------


def _expand(args: list[str]) -> list[Path]:
    """Paths as given; a pattern the shell did not expand (quoted `part-*`) is globbed here."""
    out: list[Path] = []
    for a in args:
        if not os.path.exists(a) and glob.has_magic(a):
            matches = sorted(glob.glob(a))
            if not matches:
                raise BundleError(f"no directory matches {a}; pass the directories that hold the bundle parts")
            out += [Path(m) for m in matches]
        else:
            out.append(Path(a))
    return out


def part_dirs(args: list[str], default: Path | None = None) -> list[Path]:
    """The part directories to read: each given dir that holds a manifest, plus part-NNN dirs
    inside each given dir (a bundle root). With nothing given: ``default`` (this file's dir) and,
    when that is itself a part, its part-NNN siblings."""
    given = _expand(args)
    if not given:
        if default is None:
            raise BundleError("no bundle given; pass the bundle directory or --parts DIR ...")
        given = [default]
        if PART_RE.match(default.name) and (default / MANIFEST).is_file():
            given += sorted(p for p in default.parent.iterdir() if PART_RE.match(p.name) and p != default)
    dirs: list[Path] = []
    for d in given:
        if not d.is_dir():
            raise BundleError(f"{d} is not a directory; pass the bundle directory or its part directories")
        found = [d] if (d / MANIFEST).is_file() and PART_RE.match(d.name) else []
        found += sorted(p for p in d.iterdir() if p.is_dir() and PART_RE.match(p.name) and (p / MANIFEST).is_file())
        if not found and (d / MANIFEST).is_file():
            found = [d]  # a part directory renamed on the way is still a part
        if not found:
            raise BundleError(f"{d} holds no bundle part (no {MANIFEST}); pass the directories copied from the bundle's part-NNN")
        for p in found:
            if p.resolve() not in {x.resolve() for x in dirs}:
                dirs.append(p)
    return dirs


def load_manifest(dirs: list[Path]) -> dict:
    manifest = None
    for d in dirs:
        try:
            m = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise BundleError(f"{d / MANIFEST} cannot be read ({exc}); copy that part again")
        if m.get("format") != FORMAT or m.get("schema") != SCHEMA:
            raise BundleError(f"{d / MANIFEST} is not an rftstack bundle manifest of schema {SCHEMA}; use the installer that came with it")
        if manifest is None:
            manifest = m
        elif m.get("bundle_id") != manifest.get("bundle_id"):
            raise BundleError(f"{d} belongs to another bundle (id {m.get('bundle_id', '?')[:12]}, not {manifest.get('bundle_id', '?')[:12]}); pass only parts of one bundle")
    if manifest is None:
        raise BundleError("no bundle part given; pass the bundle directory or --parts DIR ...")
    return manifest


# ------------------------------------------------------------------------------------------------
# Verifying and reassembling
# ------------------------------------------------------------------------------------------------


def _pieces(entry: dict) -> list[dict]:
    """A file's pieces in order: its chunks, or the whole file as one piece."""
    if entry.get("chunks"):
        return entry["chunks"]
    return [{"name": entry["name"], "part": entry["parts"][0], "sha256": entry["sha256"], "size": entry["size"]}]


def locate(manifest: dict, dirs: list[Path]) -> tuple[dict[str, Path], list[tuple[str, str]]]:
    """Piece name -> path, and (sentence, part) for each missing piece."""
    by_part = {d.name: d for d in dirs}
    found: dict[str, Path] = {}
    missing: list[str] = []
    for entry in manifest["files"]:
        chunked = bool(entry.get("chunks"))
        for piece in _pieces(entry):
            candidates = [by_part[piece["part"]] / piece["name"]] if piece["part"] in by_part else []
            candidates += [d / piece["name"] for d in dirs]
            path = next((c for c in candidates if c.is_file()), None)
            if path is None:
                what = f"chunk {piece['name']} of {entry['name']}" if chunked else f"file {piece['name']}"
                missing.append((f"Missing {what} (in {piece['part']}); copy {piece['part']} and pass it too.", piece["part"]))
            else:
                found[piece["name"]] = path
    return found, missing


def verify(manifest: dict, dirs: list[Path], progress=None) -> dict[str, Path]:
    """Check every piece's presence, size and sha256. Returns piece name -> path, or raises."""
    found, missing = locate(manifest, dirs)
    if missing:
        parts = sorted({part for _, part in missing})
        sentences = [s for s, _ in missing]
        sentences.append(f"The bundle is incomplete: {len(parts)} of {len(manifest['parts'])} parts lack files ({', '.join(parts)}); nothing was installed.")
        raise BundleError(sentences)
    bad: list[str] = []
    for entry in manifest["files"]:
        for piece in _pieces(entry):
            path = found[piece["name"]]
            size = path.stat().st_size
            if size != piece["size"]:
                bad.append(f"{path} has {size} bytes, the manifest says {piece['size']}; copy {piece['part']} again.")
                continue
            digest = sha256_file(path)
            if progress:
                progress(piece["name"], size)
            if digest != piece["sha256"]:
                bad.append(f"{path} has sha256 {digest}, the manifest says {piece['sha256']}; copy {piece['part']} again.")
    if bad:
        bad.append("Nothing was installed.")
        raise BundleError(bad)
    return found


def reassemble(manifest: dict, found: dict[str, Path], work: Path) -> list[Path]:
    """The wheel paths to install: whole files where they lie, chunked ones joined under ``work``."""
    wheels: list[Path] = []
    for entry in manifest["files"]:
        if not entry.get("chunks"):
            wheels.append(found[entry["name"]])
            continue
        out = work / entry["name"]
        try:
            with open(out, "wb") as dst:
                for piece in entry["chunks"]:
                    with open(found[piece["name"]], "rb") as src:
                        shutil.copyfileobj(src, dst, _BLOCK)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise BundleError(f"the disk holding {work} is full while joining {entry['name']} ({entry['size']} bytes); free space or pass --work DIR on a larger disk")
            raise
        digest = sha256_file(out)
        if digest != entry["sha256"]:
            raise BundleError(f"{entry['name']} joined from its chunks has sha256 {digest}, the manifest says {entry['sha256']}; copy its parts again")
        wheels.append(out)
    return wheels


# ------------------------------------------------------------------------------------------------
# Installing
# ------------------------------------------------------------------------------------------------


def check_target(manifest: dict) -> None:
    want = manifest["target"]["python"]
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if ".".join(want.split(".")[:2]) != have:
        raise BundleError(f"this bundle was built for Python {want}, but {sys.executable} is Python {have}; run the installer with a Python {want}, or pass --ignore-target")
    if not sys.platform.startswith("linux"):
        raise BundleError(f"this bundle was built for {manifest['target']['platform']}, but this is {sys.platform}; run it on the target machine")


_NOT_INSTALLED = re.compile(r"^(\S+) (\S+) requires ([A-Za-z0-9._-]+), which is not installed\.?$")
_WRONG = re.compile(r"^(\S+) (\S+) has requirement ([A-Za-z0-9._-]+)")


def classify_pip_check(output: str, excluded: list[str]) -> tuple[list[str], list[str]]:
    """pip check lines -> (expected: about packages the build excluded on purpose, other)."""
    ex = {canonical(e) for e in excluded}
    expected, other = [], []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        m = _NOT_INSTALLED.match(line)
        (expected if m and canonical(m.group(3)) in ex else other).append(line)
    return expected, other


def _env(target: Path | None) -> dict:
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(target)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


RECORD_NAME = "rftstack_bundle.json"  # read by `rftstack doctor` (checks/pyenv.py)


def write_record(manifest: dict, target: Path | None) -> Path:
    """Record in site-packages what this bundle left out on purpose, so `rftstack doctor` reports a
    requirement missing for that reason as expected (INFO) rather than as a broken install."""
    import sysconfig

    site = target if target is not None else Path(sysconfig.get_paths()["purelib"])
    patterns = manifest.get("excluded_patterns") or []
    record = {
        "bundle_id": manifest.get("bundle_id"),
        "lock_sha256": manifest.get("lock_sha256"),
        "excluded": sorted(manifest.get("excluded", [])),
        "reason": "left out of the offline bundle when it was built (rftstack bundle build"
        + (f" --exclude {' '.join(patterns)}" if patterns else " exclusions")
        + "; docs/bundle.md: large optional wheels the serve path does not import)",
    }
    path = site / RECORD_NAME
    tmp = path.with_name(f".{RECORD_NAME}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def compile_bytecode(target: Path | None, log) -> dict:
    """Write .pyc files for the installed tree with all cores (python -m compileall -j 0).

    Every process of the serve path imports torch, vLLM and transformers; without bytecode each
    pays the compilation again whenever the install location is read-only (docs/benchmarks.md).
    A file that does not compile (test data in some wheels) is reported, not fatal.
    """
    import sysconfig

    dirs = [str(target)] if target is not None else sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    log(f"byte-compiling {', '.join(dirs)} with {os.cpu_count()} workers")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *dirs], capture_output=True, text=True)
    seconds = round(time.monotonic() - started, 1)
    failed = [l for l in proc.stdout.splitlines() if l.startswith("*** Error compiling")]
    log(f"byte-compiled in {seconds} s" + (f" ({len(failed)} file(s) did not compile; they run from source)" if failed else ""))
    return {"seconds": seconds, "exit": proc.returncode, "not_compiled": failed[:50]}


def install(manifest: dict, wheels: list[Path], *, target: Path | None, compile: bool, relax: bool, log) -> dict:
    # pip byte-compiles file by file in one process; compileall below uses every core instead.
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check", "--no-compile"]
    if target is not None:
        cmd += ["--target", str(target), "--upgrade"]
    log(f"installing {len(wheels)} wheels with pip ({'into ' + str(target) if target else sys.executable})")
    rc = subprocess.call(cmd + [str(w) for w in wheels], stdout=sys.stderr)
    if rc != 0:
        raise BundleError(f"pip install failed (exit {rc}); its output is above", exit_code=4)
    result: dict = {"installed": len(wheels), "target": str(target) if target else sys.executable}
    result["record"] = str(write_record(manifest, target))
    if compile:
        result["compile"] = compile_bytecode(target, log)

    has_rftstack = any(canonical(f["dist"]) == "rftstack" for f in manifest["files"])
    if relax and has_rftstack:
        cmd = [sys.executable, "-m", "rftstack", "relax", "--json"]
        if target is not None:
            cmd += ["--site", str(target)]
        log("applying the relaxation policy: " + " ".join(cmd[1:]))
        proc = subprocess.run(cmd, env=_env(target), capture_output=True, text=True)
        try:
            relax_out = json.loads(proc.stdout) if proc.stdout.strip() else None
        except ValueError:
            relax_out = proc.stdout
        result["relax"] = {"exit": proc.returncode, "output": relax_out, "stderr": proc.stderr.strip()[-2000:]}
        if proc.returncode != 0:
            log(f"relax failed (exit {proc.returncode}): {proc.stderr.strip()[-500:] or proc.stdout.strip()[-500:]}")
    else:
        result["relax"] = {"skipped": "--skip-relax" if not relax else "rftstack is not in this bundle"}

    proc = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"], env=_env(target), capture_output=True, text=True)
    expected, other = classify_pip_check(proc.stdout + proc.stderr, manifest.get("excluded", []))
    result["pip_check"] = {"exit": proc.returncode, "expected": expected, "problems": other}
    return result


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="the bundle directory, or part directories (default: this installer's own bundle)")
    parser.add_argument("--parts", nargs="+", default=[], metavar="DIR", help="part directories (or a quoted glob such as '/tmp/wh/part-*')")
    parser.add_argument("--target", type=Path, help="install into this directory (pip --target) instead of the running interpreter")
    parser.add_argument("--no-compile", action="store_true", help="do not byte-compile (faster install; first imports are slower)")
    parser.add_argument("--work", type=Path, help="where to join chunked wheels (default: a temporary directory)")
    parser.add_argument("--skip-relax", action="store_true", help="do not run `python -m rftstack relax` after installing")
    parser.add_argument("--ignore-target", action="store_true", help="install even though the bundle was built for another Python")
    parser.add_argument("--verify-only", action="store_true", help="check the parts and hashes, install nothing")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def _log(msg: str) -> None:
    print(f"install: {msg}", file=sys.stderr, flush=True)


def run(args, default_dir: Path | None = None) -> int:
    try:
        dirs = part_dirs(list(args.dirs) + list(args.parts), default_dir)
        manifest = load_manifest(dirs)
        if not args.verify_only and not args.ignore_target:
            check_target(manifest)
        total = sum(f["size"] for f in manifest["files"])
        _log(f"bundle {manifest['bundle_id'][:12]}: {len(manifest['files'])} files, {total / 2**20:.1f} MiB in {len(manifest['parts'])} parts; {len(dirs)} part dirs given")
        found = verify(manifest, dirs)
        _log("every file and chunk is present with the right sha256")
        summary: dict = {"bundle_id": manifest["bundle_id"], "target": manifest["target"], "files": len(manifest["files"]), "bytes": total, "parts": [str(d) for d in dirs], "verified": True}
        if args.verify_only:
            return _finish(summary, args.json, 0)
        own_work = args.work is None
        work = Path(tempfile.mkdtemp(prefix="rftstack-bundle-")) if own_work else args.work
        work.mkdir(parents=True, exist_ok=True)
        try:
            wheels = reassemble(manifest, found, work)
            result = install(manifest, wheels, target=args.target, compile=not args.no_compile, relax=not args.skip_relax, log=_log)
        finally:
            if own_work:
                shutil.rmtree(work, ignore_errors=True)
        summary.update(result)
        code = 0
        if result["relax"].get("exit", 0) != 0:
            code = 3
        if result["pip_check"]["problems"]:
            code = 3
        for line in result["pip_check"]["expected"]:
            _log(f"pip check (expected, excluded at build): {line}")
        for line in result["pip_check"]["problems"]:
            _log(f"pip check: {line}")
        if not result["pip_check"]["problems"]:
            _log("pip check: clean" + (f" apart from {len(result['pip_check']['expected'])} line(s) about excluded packages" if result["pip_check"]["expected"] else ""))
        return _finish(summary, args.json, code)
    except BundleError as exc:
        for p in exc.problems:
            print(f"install: {p}", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "problems": exc.problems}, indent=2))
        return exc.exit_code


def _finish(summary: dict, as_json: bool, code: int) -> int:
    summary["ok"] = code == 0
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        verb = "verified" if "installed" not in summary else f"installed {summary['installed']} wheels into {summary['target']}"
        print(f"bundle {summary['bundle_id'][:12]}: {verb}" + ("" if code == 0 else f" (exit {code}, see above)"))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="install.py", description="Install an offline rftstack wheel bundle (stdlib + pip only).")
    configure(parser)
    return run(parser.parse_args(argv), default_dir=Path(__file__).resolve().parent)


if __name__ == "__main__":
    sys.exit(main())
