"""Install time and size on disk: the locked environment (uv) against the report's pip route.

Phases (each in its own fresh temporary directory under --work, removed afterwards unless --keep):

  uv-cold     `uv sync --locked` into a new venv with a new, empty UV_CACHE_DIR (downloads everything)
  uv-warm     the same again into another new venv, reusing uv-cold's cache (or --warm-cache)
  uv-warm-bytecode  the same with `--compile-bytecode` (uv writes no .pyc by default: without them
              every new Python process compiles what it imports, and a read-only install such as
              the Nix store can never cache them)
  pip-report  the report's route: `python -m venv` + `pip install 'trinity-rft[vllm]==0.6.0'`
              (fails to resolve as published: we time it until it fails, or --pip-report-timeout)
  pip-locked  pip installing our exact pinned set (`uv export --no-hashes`) with `--no-deps`
              (pip's resolver rejects the set because verl declares numpy<2, which is the point of
              the override) and `--no-cache-dir` (a cold cache, and nothing left to delete)

Sizes: `apparent` sums st_size of every file once per inode (like `du -sb`); `unshared` sums only
files with a single link: uv hardlinks files from its cache into the venv when both are on one
file system, so a venv's own cost on disk is its unshared part while the cache is kept.

    python bench/install_bench.py --out bench/results/install [--phases uv-cold,uv-warm,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("uv-cold", "uv-warm", "uv-warm-bytecode", "pip-report", "pip-locked")
REPORT_SPEC = "trinity-rft[vllm]==0.6.0"


def tree_size(root: Path) -> dict:
    """Files, apparent bytes (each inode once) and unshared bytes (files with one link) under ``root``."""
    seen: set[tuple[int, int]] = set()
    files = apparent = unshared = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            files += 1
            apparent += st.st_size
            if st.st_nlink == 1:
                unshared += st.st_size
    return {"files": files, "apparent_bytes": apparent, "unshared_bytes": unshared}


def du_sb(*paths: Path) -> int | None:
    """`du -sbc PATHS` total (du counts a hardlinked inode once across all its arguments)."""
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return None
    out = subprocess.run(["du", "-sbc", *existing], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return int(out.stdout.strip().splitlines()[-1].split()[0])


def timed(argv: list[str], *, env: dict, cwd: Path, log: Path, timeout: float) -> dict:
    """Run ``argv``, output to ``log``; wall seconds, exit status, whether it timed out, last lines."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait()
            timed_out = True
    wall = time.monotonic() - t0
    tail = log.read_text(errors="replace").splitlines()[-15:]
    return {"argv": argv, "wall_s": round(wall, 2), "rc": rc, "timed_out": timed_out, "log_tail": tail}


def base_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}
    env.update(UV_NO_PROGRESS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off", **extra)
    return env


def phase_uv(work: Path, cache: Path, name: str, python: str, timeout: float) -> dict:
    venv = work / f"{name}-venv"
    env = base_env(UV_CACHE_DIR=str(cache), UV_PROJECT_ENVIRONMENT=str(venv), UV_PYTHON=python)
    cache_before = tree_size(cache) if cache.exists() else {"apparent_bytes": 0}
    argv = ["uv", "sync", "--locked"] + (["--compile-bytecode"] if name.endswith("bytecode") else [])
    r = timed(argv, env=env, cwd=REPO, log=work / f"{name}.log", timeout=timeout)
    r.update(
        venv=tree_size(venv),
        cache=tree_size(cache),
        cache_bytes_before=cache_before["apparent_bytes"],
        venv_plus_cache_du_bytes=du_sb(venv, cache),
        venv_du_bytes=du_sb(venv),
        same_filesystem=venv.exists() and cache.exists() and os.stat(venv).st_dev == os.stat(cache).st_dev,
    )
    return r


def phase_pip_report(work: Path, python: str, timeout: float) -> dict:
    venv = work / "pip-report-venv"
    env = base_env()
    v = timed([python, "-m", "venv", str(venv)], env=env, cwd=work, log=work / "pip-report-venv.log", timeout=120)
    r = timed(
        [str(venv / "bin/python"), "-m", "pip", "install", "--no-cache-dir", REPORT_SPEC],
        env=env, cwd=work, log=work / "pip-report.log", timeout=timeout,
    )
    text = (work / "pip-report.log").read_text(errors="replace")
    r.update(
        venv_create_s=v["wall_s"],
        resolved=r["rc"] == 0,
        resolution_impossible="ResolutionImpossible" in text or "conflicting dependencies" in text,
        venv=tree_size(venv),
    )
    return r


def export_requirements(work: Path) -> Path:
    req = work / "requirements.txt"
    out = subprocess.run(
        ["uv", "export", "--locked", "--no-hashes", "--no-emit-project", "--format", "requirements-txt"],
        capture_output=True, text=True, cwd=REPO, env=base_env(), check=True,
    )
    req.write_text(out.stdout)
    return req


def phase_pip_locked(work: Path, python: str, timeout: float) -> dict:
    venv = work / "pip-locked-venv"
    env = base_env()
    req = export_requirements(work)
    n = sum(1 for line in req.read_text().splitlines() if line and not line.startswith(("#", " ")))
    v = timed([python, "-m", "venv", str(venv)], env=env, cwd=work, log=work / "pip-locked-venv.log", timeout=120)
    r = timed(
        [str(venv / "bin/python"), "-m", "pip", "install", "--no-cache-dir", "--no-deps", "-r", str(req)],
        env=env, cwd=work, log=work / "pip-locked.log", timeout=timeout,
    )
    r.update(venv_create_s=v["wall_s"], requirements=n, venv=tree_size(venv), venv_du_bytes=du_sb(venv))
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for install.json and the phase logs")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    ap.add_argument("--work", default=None, help="parent of the temporary directory (default: $TMPDIR)")
    ap.add_argument("--python", default=f"python{sys.version_info.major}.{sys.version_info.minor}",
                    help="interpreter for the venvs (default: this one's version)")
    ap.add_argument("--timeout", type=float, default=1800, help="limit per install, seconds")
    ap.add_argument("--pip-report-timeout", type=float, default=900, help="limit for the report's pip route")
    ap.add_argument("--keep", action="store_true", help="keep the venvs and caches (they are large)")
    ap.add_argument("--warm-cache", default=None, help="an existing UV_CACHE_DIR for the warm phases (instead of uv-cold's)")
    args = ap.parse_args(argv)

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        print(f"install_bench: unknown phase {bad[0]!r}; choose from {', '.join(PHASES)}", file=sys.stderr)
        return 2
    if any(p.startswith("uv-warm") for p in phases) and "uv-cold" not in phases and not args.warm_cache:
        print("install_bench: the uv-warm phases reuse uv-cold's cache; run uv-cold too or pass --warm-cache DIR", file=sys.stderr)
        return 2
    found = shutil.which(args.python)
    if not found:
        print(f"install_bench: no interpreter {args.python!r} on PATH; pass --python PATH", file=sys.stderr)
        return 2
    # resolve shims (pyenv) to the real executable, so uv and venv see the interpreter itself
    python = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True).stdout.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rftstack-install-bench-", dir=args.work))
    uv_version = subprocess.run(["uv", "--version"], capture_output=True, text=True).stdout.strip()
    pyver = subprocess.run([python, "--version"], capture_output=True, text=True).stdout.strip()
    result: dict = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": pyver, "uv": uv_version},
        "lock_sha256": __import__("hashlib").sha256((REPO / "uv.lock").read_bytes()).hexdigest(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "phases": {},
    }
    cache = Path(args.warm_cache) if args.warm_cache and "uv-cold" not in phases else work / "uv-cache"
    result["uv_cache"] = "fresh (uv-cold)" if cache == work / "uv-cache" else f"existing: {cache}"

    def save() -> None:
        (out / "install.json").write_text(json.dumps(result, indent=2) + "\n")

    try:
        for ph in phases:
            print(f"[install_bench] {ph} ...", flush=True)
            if ph.startswith("uv-"):
                r = phase_uv(work, cache, ph, python, args.timeout)
            elif ph == "pip-report":
                r = phase_pip_report(work, python, args.pip_report_timeout)
            else:
                r = phase_pip_locked(work, python, args.timeout)
            result["phases"][ph] = r
            print(f"[install_bench] {ph}: rc={r['rc']} {r['wall_s']} s"
                  + (f", venv {r['venv']['apparent_bytes'] / 1e9:.2f} GB" if "venv" in r else ""), flush=True)
            save()
            # pip venvs are independent copies: remove them at once (disk is the limit here)
            if not args.keep and (ph.startswith("pip") or ph == "uv-warm-bytecode"):
                shutil.rmtree(work / f"{ph}-venv", ignore_errors=True)
    finally:
        for log in work.glob("*.log"):
            shutil.copy(log, out / log.name)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        save()
    print(json.dumps({k: {"rc": v["rc"], "wall_s": v["wall_s"]} for k, v in result["phases"].items()}))
    return 0 if all(v["rc"] == 0 or k == "pip-report" for k, v in result["phases"].items()) else 1


if __name__ == "__main__":
    sys.exit(main())
