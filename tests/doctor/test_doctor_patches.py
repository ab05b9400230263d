"""The doctor's patch findings (checks/policy_patches.py) over a real site-packages copy: uvicorn's
httptools protocol as published, then after `rftstack relax` has patched it."""

from __future__ import annotations

import json

import uvicorn_helpers

from helpers import run_cli
from rftstack.stack import patches, policy
from rftstack.doctor.checks import policy_patches
from rftstack.findings import OK, WARN


def test_a_missing_uvicorn_patch_is_a_finding_that_says_run_relax(tmp_path):
    site = uvicorn_helpers.add_uvicorn(tmp_path)
    pol = policy.load()
    [f] = policy_patches.check(policy_patches.plans(pol, [site]), pol)
    assert f.status == WARN and f.fix == "Run `rftstack relax`."
    assert f.check == "patch.uvicorn-httptools-ignore-upgrade"
    assert f.message.startswith("The policy patch uvicorn-httptools-ignore-upgrade.patch is not applied to uvicorn 0.54.0 "
                                "(uvicorn/protocols/http/httptools_impl.py); without it: uvicorn's httptools protocol")
    assert "EMPTY body" in f.message
    patches.apply_policy(site, pol, dists=["uvicorn"])
    [ok] = policy_patches.check(policy_patches.plans(pol, [site]), pol)
    assert ok.status == OK and ok.data["applied"] == ["uvicorn-httptools-ignore-upgrade.patch"]


def test_a_file_the_patch_does_not_fit_names_the_lock(tmp_path):
    site = uvicorn_helpers.add_uvicorn(tmp_path)
    (site / uvicorn_helpers.REL).write_text("changed by hand\n")
    pol = policy.load()
    [f] = policy_patches.check(policy_patches.plans(pol, [site]), pol)
    assert f.status == WARN and "uv sync --locked" in f.fix and "does not fit" in f.message


def test_doctor_reports_the_patches_of_this_environment():
    """This venv has had `rftstack relax` (CI and the setup do it first): the doctor says all applied."""
    skips = [a for c in ("gpu", "elf", "toolchain", "vllm-api", "network", "ray") for a in ("--skip", c)]
    out = run_cli("doctor", "--json", *skips, timeout=300)
    found = {f["check"]: f for f in json.loads(out.stdout)["findings"]}
    assert found["patch"]["status"] == OK, found.get("patch")
    assert "uvicorn-httptools-ignore-upgrade.patch" in found["patch"]["data"]["applied"]
