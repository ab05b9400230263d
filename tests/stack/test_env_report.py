"""`rftstack env` on the real synced environment, and against a lock that disagrees with it."""

from __future__ import annotations

import json

from helpers import REPO, run_cli
from rftstack.stack.env_report import Row, compare


def test_compare_states():
    rows = {r.name: r.state for r in compare(
        {"torch": "2.11.0", "vllm": "0.23.0", "verl": "0.8.0", "numpy": "2.3.5"},
        {"torch": "2.11.0+cu128", "vllm": "0.23.0", "numpy": "2.2.6", "pip": "24.0"},
    )}
    assert rows == {"torch": "flavour", "vllm": "ok", "verl": "missing", "numpy": "differs", "pip": "extra"}
    assert Row("x", "1.0", "1.0+cu129").state == "flavour" and Row("x", "1.0", "1.0.1").state == "differs"


def test_env_on_the_synced_stack_is_clean():
    r = run_cli("env", "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["problems"] == []
    # CI runs `rftstack relax` after `uv sync`, which patches torch; the shared dev venv may not be
    states = {p["patch"]: p["state"] for p in rep["patches"]}
    assert {p["dist"] for p in rep["patches"]} == {"ray", "torch", "trinity-rft", "uvicorn", "verl", "vllm"}
    assert set(states.values()) <= {"already", "pending"}
    assert rep["ok"] is (set(states.values()) == {"already"}) and r.returncode == (0 if rep["ok"] else 1)
    assert rep["key_packages"]["vllm"] == {"locked": "0.23.0", "installed": "0.23.0", "state": "ok"}
    assert {p["dist"]: p["state"] for p in rep["policy"]} == {"verl": "applied", "trinity-rft": "applied"}
    assert rep["cuda"]["torch"] == "13.0"  # PyPI torch 2.11.0 is the CUDA 13 build
    assert rep["flavour"] == "cuda13"


def test_env_names_what_differs_from_the_lock(tmp_path):
    lock = (REPO / "uv.lock").read_text()
    old = 'name = "vllm"\nversion = "0.23.0"'
    assert old in lock
    (tmp_path / "uv.lock").write_text(lock.replace(old, 'name = "vllm"\nversion = "0.19.1"'))
    r = run_cli("env", "--lock", str(tmp_path / "uv.lock"))
    assert r.returncode == 1
    assert "PROBLEM vllm: locked 0.19.1, installed 0.23.0" in r.stdout
    assert "fix: run `uv sync --locked`" in r.stdout


def test_env_with_missing_lock_is_one_sentence(tmp_path):
    r = run_cli("env", "--lock", str(tmp_path / "nope.lock"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"rftstack env: lock file {tmp_path / 'nope.lock'} does not exist; pass the path of the project's uv.lock"


def test_patch_states_pending_applied_absent_mismatch(tmp_path):
    from patch_helpers import TORCH_REL, add_torch

    from rftstack.stack import env_report
    from rftstack.stack import policy
    from rftstack.stack import relax

    pol = policy.load()
    assert {p["state"] for p in env_report.patch_states([tmp_path], pol)} == {"absent"}
    site = add_torch(tmp_path / "site")

    def torch_state():
        [p] = [p for p in env_report.patch_states([site], pol) if p["dist"] == "torch"]
        return p

    p = torch_state()
    assert (p["state"], p["files"], p["version"]) == ("pending", [TORCH_REL], "2.11.0")
    relax.apply_policy([site], pol)
    assert torch_state()["state"] == "already"
    (site / TORCH_REL).write_text("print('someone else edited this file')\n")
    p = torch_state()
    assert p["state"] == "mismatch" and "matches neither" in p["reason"]
