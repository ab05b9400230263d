"""`rftstack relax` on the real verl 0.8.0 and trinity-rft 0.6.0 dist-info, as published.

The wheels are downloaded from the URLs in uv.lock (hash-checked against it) and their dist-info
directories unpacked into a temporary site-packages.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, PYTHON_DIR, run_cli
from rftstack import lockfile, policy, relax
from rftstack.errors import UserError

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rftstack-tests" / "wheels"


def _locked_wheel(name: str) -> Path:
    lock = lockfile.load(REPO / "uv.lock")
    pkg = lock.resolve(lockfile.current_environment())[name]
    (wheel,) = [w for w in pkg.wheels if w.filename.endswith("-py3-none-any.whl")]
    path = CACHE / wheel.filename
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != wheel.sha256:
        CACHE.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(wheel.url, timeout=120) as r:
            data = r.read()
        assert hashlib.sha256(data).hexdigest() == wheel.sha256, "download does not match uv.lock"
        path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def published_wheels():
    return [_locked_wheel("verl"), _locked_wheel("trinity-rft")]


@pytest.fixture
def site(tmp_path, published_wheels) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir()
    for whl in published_wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site, [n for n in z.namelist() if ".dist-info/" in n.split("/", 1)[0] + "/"])
    return site


def _requires(dist_info: Path) -> list[str]:
    return [l.split(":", 1)[1].strip() for l in (dist_info / "METADATA").read_text().splitlines() if l.startswith("Requires-Dist:")]


def _record_entry(dist_info: Path) -> list[str]:
    rows = csv.reader(io.StringIO((dist_info / "RECORD").read_text()))
    return next(r for r in rows if r[0] == f"{dist_info.name}/METADATA")


def test_relax_rewrites_metadata_and_record(site):
    pol = policy.load()
    plans = relax.relax([site], pol)
    assert {p.dist: p.state for p in plans} == {"verl": relax.CHANGED, "trinity-rft": relax.CHANGED}
    verl = site / "verl-0.8.0.dist-info"
    reqs = _requires(verl)
    assert "numpy<2.0.0" not in reqs and "numpy<2.4,>=2" in reqs
    assert "greenlet>=3" in _requires(site / "trinity_rft-0.6.0.dist-info")
    for d in (verl, site / "trinity_rft-0.6.0.dist-info"):
        data = (d / "METADATA").read_bytes()
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert _record_entry(d)[1:] == [digest, str(len(data))]


def test_relaxed_metadata_satisfies_pip_requirement_logic(site):
    """The rewritten requirement is valid PEP 508 and admits the locked numpy."""
    from packaging.requirements import Requirement

    relax.relax([site], policy.load())
    (numpy_req,) = [Requirement(r) for r in _requires(site / "verl-0.8.0.dist-info") if r.startswith("numpy")]
    lock = lockfile.load(REPO / "uv.lock")
    assert numpy_req.specifier.contains(lock.resolve(lockfile.target_environment("3.12"))["numpy"].version)


def test_relax_is_idempotent(site):
    pol = policy.load()
    relax.relax([site], pol)
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    plans = relax.relax([site], pol)
    assert {p.state for p in plans} == {relax.APPLIED}
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before


def test_relax_never_writes_through_hard_links(site, tmp_path):
    """uv hard-links installed files to its cache: the cache copy must keep the published text."""
    meta = site / "verl-0.8.0.dist-info" / "METADATA"
    cache_copy = tmp_path / "cache-METADATA"
    os.link(meta, cache_copy)
    original = cache_copy.read_bytes()
    relax.relax([site], policy.load())
    assert cache_copy.read_bytes() == original
    assert meta.read_bytes() != original


def test_relax_refuses_other_versions_and_writes_nothing(site):
    meta = site / "verl-0.8.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.8.0", "Version: 0.9.0", 1))
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"verl 0\.9\.0 is installed but the policy was written for verl 0\.8\.0"):
        relax.relax([site], policy.load())
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before  # trinity untouched too


def test_relax_refuses_when_upstream_line_differs(site):
    meta = site / "verl-0.8.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Requires-Dist: numpy<2.0.0", "Requires-Dist: numpy<1.27"))
    with pytest.raises(UserError, match=r"declares \['numpy<1.27'\] instead of 'numpy<2.0.0'"):
        relax.relax([site], policy.load())


def test_absent_distribution_is_reported_not_an_error(tmp_path):
    plans = relax.relax([tmp_path], policy.load())
    assert {p.state for p in plans} == {relax.ABSENT}


def test_cli_check_json_and_exit_codes(site):
    r = run_cli("relax", "--site", str(site), "--check")
    assert r.returncode == 1 and "verl 0.8.0: would change: relax 'numpy<2.0.0' -> 'numpy<2.4,>=2'" in r.stdout
    r = run_cli("relax", "--site", str(site), "--json")
    assert r.returncode == 0
    import json

    states = {d["dist"]: d["state"] for d in json.loads(r.stdout)["distributions"]}
    assert states == {"verl": "changed", "trinity-rft": "changed"}
    r = run_cli("relax", "--site", str(site), "--check")
    assert r.returncode == 0 and "verl 0.8.0: already as the policy wants" in r.stdout


def test_cli_bad_policy_is_one_sentence(site, tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text("schema = 1\n[[relax]]\ndist = 'verl'\n")
    r = run_cli("relax", "--site", str(site), "--policy", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith("rftstack relax: policy file") and "Traceback" not in r.stderr


def test_standalone_script_runs_on_a_bare_python(site, tmp_path):
    """The Nix build and the bundle installer run relax.py + policy.py with only the standard library."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("relax.py", "policy.py"):
        shutil.copy(PYTHON_DIR / "rftstack" / f, bare / f)
    shutil.copy(PYTHON_DIR / "rftstack" / "data" / "policy.toml", bare / "policy.toml")
    r = subprocess.run(
        [sys.executable, "-I", str(bare / "relax.py"), "--site", str(site), "--policy", str(bare / "policy.toml")],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "numpy<2.4,>=2" in _requires(site / "verl-0.8.0.dist-info")
