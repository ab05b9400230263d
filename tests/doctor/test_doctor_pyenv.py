"""Requirement consistency (a `pip check`) over real dist-info metadata: the installed stack, and
site dirs written here with the metadata of the report's problem 2."""

import shutil
import subprocess


from rftstack.stack import policy
from rftstack.doctor.checks import pyenv
from rftstack.findings import FAIL, OK, WARN


def _dist(site, name, version, requires=()):
    di = site / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    (di / "METADATA").write_text("\n".join(lines) + "\n")


def test_installed_stack_is_consistent_like_uv_pip_check():
    dists = pyenv.installed()
    found = pyenv.check(dists, policy.load())
    ours = [f for f in found if f.status != OK]
    if shutil.which("uv"):
        uv = subprocess.run(["uv", "pip", "check", "--python", __import__("sys").executable], capture_output=True, text=True)
        assert (uv.returncode == 0) == (not ours), (uv.stdout, uv.stderr, ours)
    assert len(dists) > 200


def test_unrelaxed_verl_numpy_says_run_relax(tmp_path):
    # the report's problem 2 as installed metadata: verl 0.8.0 says numpy<2, the stack has numpy 2
    _dist(tmp_path, "verl", "0.8.0", ["numpy<2.0.0", "packaging"])
    _dist(tmp_path, "numpy", "2.3.5")
    _dist(tmp_path, "packaging", "26.4")
    _dist(tmp_path, "opencv-python-headless", "5.0.0.93", ['numpy>=2; python_version >= "3.9"'])
    found = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load())
    [f] = found
    assert f.status == WARN and f.fix == "Run `rftstack relax`."
    assert "verl 0.8.0 has requirement numpy<2.0.0, but you have numpy 2.3.5" in f.message


def test_other_violations_fail_and_name_the_lock(tmp_path):
    # the report's downgrade: numpy 1.26.4 breaks opencv; and a missing dependency
    _dist(tmp_path, "verl", "0.8.0", ["numpy<2.0.0"])
    _dist(tmp_path, "numpy", "1.26.4")
    _dist(tmp_path, "opencv-python-headless", "4.13.0.92", ['numpy>=2; python_version >= "3.9"'])
    _dist(tmp_path, "vllm", "0.19.1", ["opencv-python-headless>=4.13.0", "mistral_common>=1.10.0", 'pywin32; sys_platform == "win32"', 'pytest; extra == "test"'])
    found = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load())
    [f] = found
    assert f.status == FAIL and "uv sync --frozen" in f.fix
    assert "opencv-python-headless 4.13.0.92 has requirement numpy>=2" in f.message
    assert "mistral_common" in f.message and "not installed" in f.message
    assert "pywin32" not in f.message and "pytest" not in f.message  # markers and extras honoured


def test_policy_add_not_declared(tmp_path):
    _dist(tmp_path, "trinity-rft", "0.6.0", [])
    found = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load())
    [f] = found
    assert f.check == "pyenv.relax.add" and "greenlet>=3" in f.message and "rftstack relax" in f.fix


# --- bundle exclusions (INFO) and distributions outside the locked stack (WARN) ----------------

import json


def test_requirement_missing_because_the_bundle_excluded_it_is_info(tmp_path):
    """The GPU host's bundle install: flashinfer-cubin left out on purpose, recorded by the installer."""
    _dist(tmp_path, "flashinfer-python", "0.6.12", ["flashinfer-cubin==0.6.12", "numpy"])
    _dist(tmp_path, "numpy", "2.3.5")
    _dist(tmp_path, "vllm", "0.23.0", ["mistral_common>=1.10.0"])  # missing and not excluded: still FAIL
    (tmp_path / pyenv.BUNDLE_RECORD).write_text(json.dumps(
        {"bundle_id": "ab" * 32, "excluded": ["flashinfer-cubin", "tilelang"], "reason": "left out of the offline bundle on purpose"}))
    ctx = pyenv.context([str(tmp_path)])
    assert ctx["bundle"]["excluded"] == ["flashinfer-cubin", "tilelang"]
    found = {f.check: f for f in pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), **ctx)}
    info = found["pyenv.bundle-excluded"]
    assert info.status == "info" and "flashinfer-cubin" in info.message and "abababababab" in info.message
    assert "left out of the offline bundle on purpose" in info.message
    fail = found["pyenv.requirements"]
    assert fail.status == FAIL and "mistral_common" in fail.message and "flashinfer-cubin" not in fail.message


def test_only_excluded_requirements_missing_is_not_a_failure(tmp_path):
    _dist(tmp_path, "flashinfer-python", "0.6.12", ["flashinfer-cubin==0.6.12"])
    (tmp_path / pyenv.BUNDLE_RECORD).write_text(json.dumps({"bundle_id": "x", "excluded": ["flashinfer-cubin"], "reason": "r"}))
    found = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), **pyenv.context([str(tmp_path)]))
    assert [(f.check, f.status) for f in found] == [("pyenv.bundle-excluded", "info"), ("pyenv.requirements", OK)]
    assert "All other requirements" in found[1].message
    # without the record the same metadata is a broken install
    (tmp_path / pyenv.BUNDLE_RECORD).unlink()
    found = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), **pyenv.context([str(tmp_path)]))
    assert [(f.check, f.status) for f in found] == [("pyenv.requirements", FAIL)]


def test_host_package_outside_the_lock_is_a_warning(tmp_path):
    """The GPU host: sentence-transformers 6.0.1 (not in uv.lock) needs huggingface-hub<2; locked is 2.4.0."""
    _dist(tmp_path, "sentence-transformers", "6.0.1", ["huggingface-hub<2,>=0.20.0", "transformers"])
    (next(tmp_path.glob("sentence_transformers-*.dist-info")) / "top_level.txt").write_text("sentence_transformers\n")
    _dist(tmp_path, "huggingface-hub", "2.4.0")
    _dist(tmp_path, "transformers", "5.0.0", ["huggingface-hub<1.0"])  # inside the lock: stays FAIL
    ctx = pyenv.context([str(tmp_path)])
    assert "sentence-transformers" not in ctx["locked"] and "transformers" in ctx["locked"]
    assert ctx["importers"]("sentence-transformers") == []  # trinity/vllm/verl sources never import it
    found = {f.check: f for f in pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), **ctx)}
    warn = found["pyenv.outside-lock"]
    assert warn.status == WARN and "sentence-transformers 6.0.1 has requirement huggingface-hub<2,>=0.20.0, but you have huggingface-hub 2.4.0" in warn.message
    fail = found["pyenv.requirements"]
    assert fail.status == FAIL and "transformers 5.0.0" in fail.message and "sentence-transformers" not in fail.message


def test_outside_the_lock_but_imported_by_the_serve_path_stays_a_failure(tmp_path):
    # a host fork installing the `msgspec` module (vLLM imports msgspec) under another name
    _dist(tmp_path, "host-msgspec-fork", "1.0", ["huggingface-hub<2"])
    (next(tmp_path.glob("host_msgspec_fork-*.dist-info")) / "top_level.txt").write_text("msgspec\n")
    _dist(tmp_path, "huggingface-hub", "2.4.0")
    ctx = pyenv.context([str(tmp_path)])
    assert ctx["importers"]("host-msgspec-fork")  # real vllm sources import msgspec
    [f] = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), **ctx)
    assert f.check == "pyenv.requirements" and f.status == FAIL and "host-msgspec-fork" in f.message


def test_without_a_lock_every_violation_fails(tmp_path):
    _dist(tmp_path, "sentence-transformers", "6.0.1", ["huggingface-hub<2"])
    _dist(tmp_path, "huggingface-hub", "2.4.0")
    [f] = pyenv.check(pyenv.installed([str(tmp_path)]), policy.load(), locked=None)
    assert f.status == FAIL
