"""`rftstack relax` on the real verl 0.8.0 and trinity-rft 0.6.0 dist-info, as published.

The wheels are downloaded from the URLs in uv.lock (hash-checked against it) and their dist-info
directories unpacked into a temporary site-packages.
"""

from __future__ import annotations

import base64
import csv
import email.parser
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

from helpers import REPO, PYTHON_DIR, run_cli
from rftstack.stack import lockfile
from rftstack.stack import policy
from rftstack.stack import relax
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
            if whl.name.startswith("trinity_rft-"):  # the policy patches trinity's files: unpack them all
                z.extractall(site)
            else:
                z.extractall(site, [n for n in z.namelist() if ".dist-info/" in n.split("/", 1)[0] + "/"
                                    or n == "verl/utils/attention_utils.py"])  # the policy patches that file  # fmt: skip
    uvicorn_helpers.add_uvicorn(site)  # the policy patches uvicorn's httptools protocol too
    add_ray(site)  # and Ray's start_raylet (the installed copy, un-patched, with its dist-info)
    add_vllm(site)  # and vLLM's logprobs processor and chat route (the same)
    return site


def _requires(dist_info: Path) -> list[str]:
    """Requires-Dist of METADATA's header only: the description after the first blank line is free text
    (a README may quote a `Requires-Dist:` line) and is not what pip reads."""
    header = email.parser.HeaderParser().parsestr((dist_info / "METADATA").read_text())
    return [v.strip() for v in header.get_all("Requires-Dist", [])]


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


def test_relax_reads_and_writes_only_the_metadata_header(site):
    """A description that quotes `Requires-Dist:` lines is free text: relax neither relaxes those nor
    adds after them (and `_requires` above does not count them)."""
    quoted = "Requires-Dist: numpy<2.0.0\nRequires-Dist: quoted-in-the-readme\n"
    for d in ("verl-0.8.0.dist-info", "trinity_rft-0.6.0.dist-info"):
        meta = site / d / "METADATA"
        meta.write_text(meta.read_text().rstrip("\n") + "\n\n" + quoted)
    relax.relax([site], policy.load())
    for d in ("verl-0.8.0.dist-info", "trinity_rft-0.6.0.dist-info"):
        assert (site / d / "METADATA").read_text().endswith("\n\n" + quoted)
    assert "numpy<2.4,>=2" in _requires(site / "verl-0.8.0.dist-info")
    assert "greenlet>=3" in _requires(site / "trinity_rft-0.6.0.dist-info")


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


def test_standalone_script_runs_on_a_bare_python(torch_site, tmp_path):
    """relax.py + policy.py + patches.py run with only the standard library."""
    site = torch_site
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("relax.py", "policy.py", "patches.py"):
        shutil.copy(PYTHON_DIR / "rftstack" / "stack" / f, bare / f)
    shutil.copy(PYTHON_DIR / "rftstack" / "data" / "policy.toml", bare / "policy.toml")
    r = subprocess.run(
        [sys.executable, "-I", str(bare / "relax.py"), "--site", str(site), "--policy", str(bare / "policy.toml"),
         "--patches", str(REPO / "patches")],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "numpy<2.4,>=2" in _requires(site / "verl-0.8.0.dist-info")
    assert f"patch {_torch_patch().file}: applied to torch 2.11.0" in r.stdout
    assert "_loopback_listen_fd" in (site / TORCH_REL).read_text()


# --- [[patch]]: relax applies the policy's source patches too ----------------------------------

from patch_helpers import TORCH_REL, add_ray, add_torch, add_vllm
import uvicorn_helpers
from patch_helpers import torch_patch as _torch_patch


@pytest.fixture
def torch_site(site) -> Path:
    """``site`` plus a copy of torch's real rendezvous.py and torch's dist-info METADATA and RECORD."""
    return add_torch(site)


def _record_line(site: Path, rel: str) -> list[str]:
    record = next(site.glob("torch-*.dist-info/RECORD"))
    return next(r for r in csv.reader(io.StringIO(record.read_text())) if r and r[0] == rel)


def test_relax_applies_policy_patches_and_rehashes_record(torch_site):
    outcome_dists, outcome_patches = relax.apply_policy([torch_site], policy.load())
    [pp] = [p for p in outcome_patches if p.dist == "torch"]
    assert (pp.file, pp.dist, pp.state, pp.files) == (_torch_patch().file, "torch", relax.PATCHED, [TORCH_REL])
    data = (torch_site / TORCH_REL).read_bytes()
    assert b"_loopback_listen_fd" in data
    digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert _record_line(torch_site, TORCH_REL)[1:] == [digest, str(len(data))]
    _, again = relax.apply_policy([torch_site], policy.load())
    assert {p.state for p in again} == {relax.ALREADY} and (torch_site / TORCH_REL).read_bytes() == data


def test_patched_file_is_written_through_a_new_inode(torch_site, tmp_path):
    cache_copy = tmp_path / "cache-rendezvous.py"
    os.link(torch_site / TORCH_REL, cache_copy)
    original = cache_copy.read_bytes()
    relax.apply_policy([torch_site], policy.load())
    assert cache_copy.read_bytes() == original and (torch_site / TORCH_REL).read_bytes() != original


def test_cli_check_reports_pending_patch_then_already(torch_site):
    import json

    r = run_cli("relax", "--site", str(torch_site), "--check")
    assert r.returncode == 1
    assert f"patch {_torch_patch().file}: would apply to torch 2.11.0 ({TORCH_REL})" in r.stdout
    assert "_loopback_listen_fd" not in (torch_site / TORCH_REL).read_text()  # --check writes nothing
    r = run_cli("relax", "--site", str(torch_site), "--json")
    assert r.returncode == 0, r.stderr
    [p] = [p for p in json.loads(r.stdout)["patches"] if p["dist"] == "torch"]
    assert (p["patch"], p["state"], p["files"]) == (_torch_patch().file, "applied", [TORCH_REL])
    r = run_cli("relax", "--site", str(torch_site), "--check")
    assert r.returncode == 0, r.stdout
    assert f"patch {_torch_patch().file}: already applied to torch 2.11.0" in r.stdout
    r = run_cli("relax", "--site", str(torch_site), "--json")
    assert {p["state"] for p in json.loads(r.stdout)["patches"]} == {"already"}


def test_cli_patch_absent_when_torch_is_not_installed(site):
    import json

    r = run_cli("relax", "--site", str(site), "--json")
    assert r.returncode == 0
    states = {p["patch"]: p["state"] for p in json.loads(r.stdout)["patches"]}
    assert states.pop(_torch_patch().file) == "absent"
    assert set(states.values()) == {"applied"}  # trinity-rft is there: its patches apply


def _snapshot(site: Path) -> dict:
    return {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}


def test_relax_refuses_a_patch_for_another_torch_version_and_writes_nothing(torch_site):
    meta = next(torch_site.glob("torch-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.11.0", "Version: 2.12.0", 1))
    before = _snapshot(torch_site)
    r = run_cli("relax", "--site", str(torch_site))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"policy patch {_torch_patch().file} does not fit" in r.stderr and "torch 2.12.0" in r.stderr
    assert _snapshot(torch_site) == before  # verl and trinity-rft's metadata untouched too


def test_relax_refuses_a_file_that_matches_neither_side(torch_site):
    target = torch_site / TORCH_REL
    target.write_text(target.read_text().replace("start_daemon = rank == 0", "start_daemon = rank == 1"))
    before = _snapshot(torch_site)
    with pytest.raises(UserError, match="matches neither the original nor the patched file"):
        relax.apply_policy([torch_site], policy.load())
    assert _snapshot(torch_site) == before


def test_relax_refuses_a_patch_file_whose_hash_differs(torch_site, tmp_path):
    from rftstack.stack import patches

    other = tmp_path / "patches"
    other.mkdir()
    text = (patches.patches_dir() / _torch_patch().file).read_text()
    (other / _torch_patch().file).write_text(text.replace("rftstack patch", "rftstack  patch", 1))
    with pytest.raises(UserError, match="sha256"):
        relax.apply_policy([torch_site], policy.load(), patches_dir=other)


def test_cuda12_rewrites_apply_to_the_cu128_torch_only_and_once(tmp_path):
    """policy.toml [[cuda12.rewrite]], as `rftstack relax` applies them (apply_policy, the bundle
    installer's relax step): torch 2.11.0+cu128's cuda-toolkit line removed, its cuda-bindings<13
    widened with the marker kept, the RECORD entry re-hashed; an extra's line and the CUDA 13
    torch 2.11.0 left alone; a second run changes nothing."""
    import dataclasses

    pol = dataclasses.replace(policy.load(), patches=())
    lines = ['cuda-toolkit[cublas,cudart]==12.8.1; platform_system == "Linux"', 'cuda-bindings<13,>=12.9.4; platform_system == "Linux"',
             'nvidia-cudnn-cu12==9.19.0.56; platform_system == "Linux"', 'cuda-toolkit==12.8.1; extra == "toolkit"']
    for version in ("2.11.0+cu128", "2.11.0"):
        site = tmp_path / version
        di = site / f"torch-{version}.dist-info"
        di.mkdir(parents=True)
        meta = f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n" + "".join(f"Requires-Dist: {l}\n" for l in lines) + "\nbody\n"
        (di / "METADATA").write_text(meta)
        (di / "RECORD").write_text(f"torch-{version}.dist-info/METADATA,sha256=old,1\n")
        plans, _ = relax.apply_policy([site], pol)
        got = _requires(di)
        if version == "2.11.0":
            assert got == lines and not [p for p in plans if p.dist == "torch"]
            continue
        assert got == ['cuda-bindings>=12.9.4; platform_system == "Linux"', 'nvidia-cudnn-cu12==9.19.0.56; platform_system == "Linux"',
                       'cuda-toolkit==12.8.1; extra == "toolkit"']
        data = (di / "METADATA").read_bytes()
        assert f"{_hash_b64(data)},{len(data)}" in (di / "RECORD").read_text()
        [again] = relax.plan_rewrites([site], pol)
        assert again.new_metadata is None


def _hash_b64(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
