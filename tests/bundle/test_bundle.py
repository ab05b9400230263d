"""rftstack bundle, end to end on a small real project: its uv.lock is a subset of the real lock
(six, idna, and the sdist-only word2number and antlr4-python3-runtime), the wheels are real PyPI
downloads, the parts are tiny so that wheels are chunked, and install.py runs in fresh venvs."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from bundle_helpers import REPO, make_project

from rftstack import cli
from rftstack.bundle import build as bundle

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
PLATFORM = "manylinux_2_17_x86_64"
PART_MIB = 0.06  # about 61 KiB: idna's 68 KiB wheel and antlr4's built wheel are chunked
DEPS = ["six", "idna", "word2number", "antlr4-python3-runtime"]


def build_args(lock: Path, out: Path, **kw) -> list[str]:
    args = ["bundle", "build", "--lock", str(lock), "--out", str(out), "--python", PY, "--platform", PLATFORM, "--part-size", str(PART_MIB), "--json"]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


def run_cli(capsys, args: list[str]) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    lock = make_project(root / "proj", DEPS)
    out = root / "out"
    rc = cli.main(build_args(lock, out))
    assert rc == 0
    return lock, out, json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="session")
def python_with_pip(tmp_path_factory):
    """A Python of this version with pip: this one when it has pip, else a venv made from it with
    `python -m venv` (ensurepip), as under `uv run`, whose .venv has no pip. Never a skip: these are
    the tests that install a bundle for real."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return sys.executable
    py = venv(tmp_path_factory.mktemp("pip-python") / "venv", sys.executable)
    r = subprocess.run([str(py), "-m", "pip", "--version"], capture_output=True, text=True)
    assert r.returncode == 0, f"`{sys.executable} -m venv` made a venv without pip: {r.stderr}"
    return str(py)


def venv(path: Path, python: str) -> Path:
    subprocess.run([python, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def installer(python, *args, cwd=None, timeout=300):
    return subprocess.run([str(python), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def copy_bundle(out: Path, dest: Path) -> Path:
    shutil.copytree(out, dest, ignore=shutil.ignore_patterns(".files"))
    return dest


def test_manifest_parts_and_chunks(built):
    lock, out, m = built
    assert m["format"] == "rftstack-bundle" and m["schema"] == 1
    assert m["lock_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert m["target"] == {"python": PY, "platform": PLATFORM, "python_tag": f"cp{PY.replace('.', '')}"}
    files = {f["dist"]: f for f in m["files"]}
    assert set(files) == set(DEPS) | {"bundle-probe"}
    assert files["six"]["source"].startswith("https://files.pythonhosted.org/") and files["six"]["sha256"] == "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
    for dist in ("word2number", "antlr4-python3-runtime", "bundle-probe"):
        assert files[dist]["source"] == bundle.BUILT_HERE and files[dist]["name"].endswith("-py3-none-any.whl")
    assert files["word2number"]["built_from"]["sha256"] == "70e27a5d387f67b04c71fbb7621c05930b19bfd26efd6851e6e0f9969dcde7d0"
    idna = files["idna"]
    assert len(idna["chunks"]) >= 2 and len(idna["parts"]) >= 2  # spread over parts
    limit = int(PART_MIB * 2**20)
    for part in m["parts"]:
        d = out / part["name"]
        assert sum(p.stat().st_size for p in d.iterdir()) <= limit
        assert (d / "install.py").is_file() and json.loads((d / "manifest.json").read_text()) == m
    joined = b"".join((out / c["part"] / c["name"]).read_bytes() for c in idna["chunks"])
    assert hashlib.sha256(joined).hexdigest() == idna["sha256"]


def test_install_py_in_a_fresh_venv(built, python_with_pip, tmp_path):
    _, out, m = built
    py = venv(tmp_path / "venv", python_with_pip)
    r = installer(py, out / "part-000" / "install.py", "--no-compile", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["ok"] and summary["installed"] == len(m["files"]) and summary["pip_check"]["problems"] == []
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    assert (site / "idna" / "__init__.py").is_file() and not (site / "idna" / "__pycache__").exists()  # --no-compile
    check = "import six, idna, word2number, antlr4, bundle_probe; print(six.__version__, idna.__version__, bundle_probe.VALUE)"
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True)
    assert r.stdout.split() == ["1.17.0", "3.20", "bundled"], r.stderr


def test_parts_in_separate_dirs_into_a_target(built, python_with_pip, tmp_path):
    _, out, m = built
    # each part arrives on its own, in a directory of its own name
    dirs = []
    for n, part in enumerate(m["parts"]):
        d = tmp_path / f"carried-{n}" / f"x{n}"
        shutil.copytree(out / part["name"], d)
        dirs.append(d)
    target = tmp_path / "site"
    r = installer(python_with_pip, dirs[0] / "install.py", "--parts", *dirs, "--target", target)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([python_with_pip, "-c", "import word2number, idna; print(idna.__file__)"], capture_output=True, text=True, env={"PYTHONPATH": str(target)})
    assert r.stdout.strip().startswith(str(target)), r.stderr


def test_quoted_glob_of_parts(built, tmp_path):
    _, out, m = built
    wh = copy_bundle(out, tmp_path / "wh")
    r = installer(sys.executable, wh / "part-000" / "install.py", "--parts", f"{wh}/part-*", "--verify-only")
    assert r.returncode == 0, r.stderr
    assert f"{len(m['parts'])} part dirs given" in r.stderr


def test_tampered_chunk_is_named_and_nothing_installed(built, tmp_path):
    _, out, m = built
    wh = copy_bundle(out, tmp_path / "wh")
    chunk = next(f for f in m["files"] if f["dist"] == "idna")["chunks"][1]
    path = wh / chunk["part"] / chunk["name"]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    target = tmp_path / "site"
    r = installer(sys.executable, wh / "install.py", wh, "--target", target, "--ignore-target")
    assert r.returncode == 2
    assert f"{path} has sha256 {actual}, the manifest says {chunk['sha256']}" in r.stderr
    assert "Nothing was installed." in r.stderr
    assert not target.exists()


def test_chunks_joined_in_the_wrong_order_are_refused_by_the_joined_hash(built, tmp_path):
    """Every chunk is intact (its own hash is right), only their order in the manifest is swapped:
    the check of the joined wheel's sha256 is the one that sees it, and nothing is installed."""
    _, out, m = built
    wh = copy_bundle(out, tmp_path / "wh")
    for manifest in wh.rglob("manifest.json"):
        mm = json.loads(manifest.read_text())
        entry = next(f for f in mm["files"] if f["dist"] == "idna")
        entry["chunks"][0], entry["chunks"][1] = entry["chunks"][1], entry["chunks"][0]
        manifest.write_text(json.dumps(mm))
    target = tmp_path / "site"
    r = installer(sys.executable, wh / "install.py", wh, "--target", target, "--ignore-target")
    assert r.returncode != 0
    assert f"{entry['name']} joined from its chunks has sha256" in r.stderr and f"the manifest says {entry['sha256']}" in r.stderr
    assert "every file and chunk is present with the right sha256" in r.stderr  # the per-chunk check passed
    assert not target.exists() or not any(target.iterdir())


def test_missing_part_lists_each_missing_piece(built, tmp_path):
    _, out, m = built
    wh = copy_bundle(out, tmp_path / "wh")
    gone = m["parts"][-1]["name"]
    shutil.rmtree(wh / gone)
    expected = [c["name"] for f in m["files"] for c in (f.get("chunks") or [{"name": f["name"], "part": f["parts"][0]}]) if c["part"] == gone]
    target = tmp_path / "site"
    r = installer(sys.executable, wh / "part-000" / "install.py", "--target", target, "--ignore-target")
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if "Missing" in l]
    assert len(lines) == len(expected) and all(f"(in {gone})" in l for l in lines)
    for name in expected:
        assert any(name in l for l in lines)
    assert f"({gone}); nothing was installed." in r.stderr
    assert not target.exists()


def test_wrong_python_is_refused(built, tmp_path):
    _, out, _ = built
    wh = copy_bundle(out, tmp_path / "wh")
    for manifest in wh.rglob("manifest.json"):  # the same bundle, as if built for another Python
        m = json.loads(manifest.read_text())
        m["target"]["python"] = "3.99"
        manifest.write_text(json.dumps(m))
    target = tmp_path / "site"
    r = installer(sys.executable, wh / "install.py", "--target", target)
    assert r.returncode == 2 and f"this bundle was built for Python 3.99, but {sys.executable} is Python {PY}" in r.stderr
    assert not target.exists()
    r = installer(sys.executable, wh / "install.py", "--verify-only")
    assert r.returncode == 0, r.stderr  # verifying works anywhere


def test_parts_of_two_bundles_are_not_mixed(built, tmp_path):
    _, out, m = built
    wh = copy_bundle(out, tmp_path / "wh")
    other = json.loads((wh / "part-001" / "manifest.json").read_text())
    other["bundle_id"] = "f" * 64
    (wh / "part-001" / "manifest.json").write_text(json.dumps(other))
    r = installer(sys.executable, wh / "part-000" / "install.py", "--verify-only")
    assert r.returncode == 2 and "belongs to another bundle" in r.stderr


def test_cli_verify_json(built, capsys):
    _, out, m = built
    rc, stdout, _ = run_cli(capsys, ["bundle", "verify", str(out), "--json"])
    assert rc == 0 and json.loads(stdout)["bundle_id"] == m["bundle_id"]


def test_rebuild_resumes_and_is_stable(built, capsys):
    lock, out, m = built
    cached = out / ".files" / "wheels" / next(f["name"] for f in m["files"] if f["dist"] == "idna")
    cached.write_bytes(cached.read_bytes()[:30000])  # an interrupted download
    rc, stdout, err = run_cli(capsys, build_args(lock, out))
    assert rc == 0
    assert "idna-3.20-py3-none-any.whl 68.0 KiB resumed, sha256 ok" in err
    assert "six-1.17.0-py2.py3-none-any.whl 10.8 KiB present" in err
    again = json.loads((out / "manifest.json").read_text())
    # the project wheel is rebuilt each time, from the same tree: every hash stays
    assert {f["name"]: f["sha256"] for f in again["files"]} == {f["name"]: f["sha256"] for f in m["files"]}
    assert again["bundle_id"] == m["bundle_id"]


def test_a_fresh_build_elsewhere_is_bit_identical(built, capsys, tmp_path):
    """Nothing cached: the wheels built here from sdists (word2number, antlr4) and from the project
    are rebuilt with SOURCE_DATE_EPOCH fixed, so they, the parts and the bundle id come out the same."""
    lock, out, m = built
    rc, stdout, err = run_cli(capsys, build_args(lock, tmp_path / "again"))
    assert rc == 0, err
    again = json.loads((tmp_path / "again" / "manifest.json").read_text())
    built_here = {f["name"]: f["sha256"] for f in m["files"] if f["source"] == bundle.BUILT_HERE}
    assert len(built_here) == 3  # word2number, antlr4-python3-runtime, the project
    assert {f["name"]: f["sha256"] for f in again["files"]} == {f["name"]: f["sha256"] for f in m["files"]}
    assert again["bundle_id"] == m["bundle_id"]


def test_have_and_exclude(built, capsys, tmp_path):
    lock, _, _ = built
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# a comment\nsix==1.17.0\nidna==3.10\n")
    rc, stdout, _ = run_cli(capsys, build_args(lock, tmp_path / "o", have=freeze, exclude="antlr4-*") + ["--dry-run"])
    s = json.loads(stdout)
    assert rc == 0 and s["dry_run"]
    assert [p["name"] for p in s["present"]] == ["six"]
    assert [p["name"] for p in s["excluded"]] == ["antlr4-python3-runtime"]
    assert {p["name"] for p in s["sent"]} == {"bundle-probe", "idna", "word2number"}
    assert not (tmp_path / "o").exists()


def test_bad_lock_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "uv.lock"
    bad.write_text("version = 1\n[[package]\n")
    rc, _, err = run_cli(capsys, ["bundle", "build", "--lock", str(bad), "--out", str(tmp_path / "o")])
    assert rc == 2 and "is not a valid uv.lock" in err and "Traceback" not in err


def _c_extension_sdist(where: Path) -> Path:
    src = where / "cext-0.1"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("from setuptools import setup, Extension\nsetup(name='cext', version='0.1', ext_modules=[Extension('cext', ['cext.c'])])\n")
    (src / "cext.c").write_text('#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "cext"};\nPyMODINIT_FUNC PyInit_cext(void) { return PyModule_Create(&m); }\n')
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: cext\nVersion: 0.1\n")
    sdist = where / "cext-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.add(src, arcname="cext-0.1")
    return sdist


def test_sdist_with_c_code_is_refused(tmp_path, capsys):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    sdist = _c_extension_sdist(tmp_path / "src")
    lock = make_project(tmp_path / "proj", ["six"])
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    text = lock.read_text().replace('{ name = "six" },', '{ name = "six" },\n    { name = "cext" },')
    text += f'\n[[package]]\nname = "cext"\nversion = "0.1"\nsource = {{ registry = "https://pypi.org/simple" }}\nsdist = {{ url = "{sdist.as_uri()}", hash = "sha256:{sha}", size = {sdist.stat().st_size} }}\n'
    lock.write_text(text)
    rc, _, err = run_cli(capsys, build_args(lock, tmp_path / "o"))
    assert rc == 1
    assert "the sdist of cext 0.1 built cext-0.1-cp" in err and "not a pure-Python (py3-none-any) wheel" in err and "--exclude cext" in err


def test_relax_runs_after_install_when_rftstack_is_bundled(python_with_pip, tmp_path, capsys):
    if not (REPO / "python" / "rftstack" / "stack" / "relax.py").is_file():
        pytest.skip("rftstack relax (python/rftstack/stack/relax.py) has not landed in this tree yet")
    # the real rftstack project, locked down to one dependency so the bundle stays small
    proj = tmp_path / "proj"
    shutil.copytree(REPO / "python", proj / "python", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "README.md", proj / "README.md")
    lock = make_project(proj, ["packaging"], name="rftstack")
    text = (proj / "pyproject.toml").read_text().replace('packages = ["rftstack"]', 'packages = ["python/rftstack"]')
    (proj / "pyproject.toml").write_text(text)
    shutil.rmtree(proj / "rftstack")
    rc, _, err = run_cli(capsys, build_args(lock, tmp_path / "out"))
    assert rc == 0, err
    py = venv(tmp_path / "venv", python_with_pip)
    r = installer(py, tmp_path / "out" / "install.py", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["relax"]["exit"] == 0 and s["pip_check"]["problems"] == []


def test_excluded_wheels_are_recorded_and_doctor_reports_them_as_info(built, python_with_pip, tmp_path, capsys):
    """A bundle built with --exclude: the installer writes rftstack_bundle.json into the target, and
    the doctor's pyenv check reports bundle-probe's missing word2number as INFO, not a failure."""
    from rftstack.stack import policy
    from rftstack.doctor.checks import pyenv

    lock, out, _ = built
    ex_out = tmp_path / "ex"
    rc, _, err = run_cli(capsys, build_args(lock, ex_out, exclude="word2number", cache=out / ".files"))
    assert rc == 0, err
    target = tmp_path / "site"
    r = installer(python_with_pip, ex_out / "part-000" / "install.py", "--target", target, "--json")  # compiles by default
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["compile"]["exit"] == 0 and summary["compile"]["not_compiled"] == []
    assert list((target / "idna" / "__pycache__").glob("__init__.cpython-*.pyc")), "bytecode written with all cores"
    assert any("word2number" in line for line in summary["pip_check"]["expected"])
    record = json.loads((target / "rftstack_bundle.json").read_text())
    manifest = json.loads((ex_out / "manifest.json").read_text())
    assert record["bundle_id"] == manifest["bundle_id"] and record["excluded"] == ["word2number"]
    assert "--exclude word2number" in record["reason"]
    found = {f.check: f for f in pyenv.check(pyenv.installed([str(target)]), policy.load(), **pyenv.context([str(target)]))}
    assert found["pyenv.bundle-excluded"].status == "info" and "word2number" in found["pyenv.bundle-excluded"].message
    assert found["pyenv.requirements"].status == "ok"


def test_relative_out_and_cache_build_the_project(built, capsys, tmp_path, monkeypatch):
    """`--out .wheelhouse` from the project root (relative paths; the wheel builder runs in another
    directory) once failed with `Source .../src does not exist`."""
    lock, out, m = built
    monkeypatch.chdir(tmp_path)
    shutil.copytree(out / ".files", tmp_path / "cache")
    rc, stdout, err = run_cli(capsys, build_args(lock, Path("rel-out"), cache="cache"))
    assert rc == 0, err
    files = {f["dist"]: f for f in json.loads((tmp_path / "rel-out" / "manifest.json").read_text())["files"]}
    assert files["bundle-probe"]["source"] == bundle.BUILT_HERE


def test_the_gpu_host_package_list_in_the_repo_reads_as_have():
    """docs/bundle.md builds the GPU host's bundle with `--have tests/gpu/host-packages.txt`."""
    have = bundle.read_have(REPO / "tests" / "gpu" / "host-packages.txt")
    assert have["torch"] == "2.11.0" and have["numpy"] == "2.5.2" and len(have) > 150
