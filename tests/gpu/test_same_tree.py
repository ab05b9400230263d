"""tests/gpu/device/same_tree.py, run here (no GPU needed): go.sh's check, after the bundle's install on the GPU
host, that the installed rftstack carries this tree's package files, policy and patches. Session O ran a bundle built before a
patch changed: the host applied the older patch and the new tests ran against it. Here the installed rftstack is
this checkout's; the trees compared are copies of it, one file changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "device" / "same_tree.py"


def check(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(tree)], capture_output=True, text=True, timeout=60)


def tree_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "patches", tree / "patches")
    shutil.copytree(
        ROOT / "python" / "rftstack", tree / "python" / "rftstack", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tree


def test_this_tree_matches_its_install():
    done = check(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches" in done.stdout and f"{len(list((ROOT / 'patches').glob('*.patch')))} patches" in done.stdout


def test_a_changed_patch_is_named_and_refused(tmp_path):
    tree = tree_copy(tmp_path)
    assert check(tree).returncode == 0
    patch = tree / "patches" / "trinity-engine-uni-executor.patch"
    patch.write_text(patch.read_text().replace('"mp"', '"uni"', 1))
    done = check(tree)
    assert done.returncode == 1
    assert "trinity-engine-uni-executor.patch (differs)" in done.stdout
    assert done.stdout.count("\n") == 1, "one sentence"


def test_policy_and_missing_or_extra_patches_are_named(tmp_path):
    tree = tree_copy(tmp_path)
    policy = tree / "python" / "rftstack" / "data" / "policy.toml"
    policy.write_text(policy.read_text() + "\n# changed\n")
    (tree / "patches" / "new-fix.patch").write_text("--- a/x.py\n+++ b/x.py\n")
    (tree / "patches" / "vllm-fork-workers.patch").unlink()
    done = check(tree)
    assert done.returncode == 1
    for name in (
        "policy.toml (differs)",
        "new-fix.patch (missing from the install)",
        "vllm-fork-workers.patch (only in the install)",
    ):
        assert name in done.stdout


def test_changed_code_is_named_though_the_patches_match(tmp_path):
    tree = tree_copy(tmp_path)
    runner = tree / "python" / "rftstack" / "stack" / "patches.py"
    runner.write_text(runner.read_text() + "\n# a later commit\n")
    (tree / "python" / "rftstack" / "new_module.py").write_text("")
    done = check(tree)
    assert done.returncode == 1
    assert "stack/patches.py (differs)" in done.stdout
    assert "new_module.py (missing from the install)" in done.stdout
    assert "patch (" not in done.stdout.replace("stack/patches.py (", ""), "no patch file is named"
