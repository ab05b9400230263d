"""Requirement consistency (a `pip check`) over real dist-info metadata: the installed stack, and
site dirs written here with the metadata of the report's problem 2."""

import shutil
import subprocess

import pytest

from rftstack import policy
from rftstack.checks import pyenv
from rftstack.findings import FAIL, OK, WARN

VENV_PY = "/work/main/.venv/bin/python"


def _dist(site, name, version, requires=()):
    di = site / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir()
    lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
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
