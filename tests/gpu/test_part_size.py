"""tests/gpu/device/part_size.py, run here (no GPU needed): the bundle's part size that fits one device call beside
the working tree. Session AF's 44 MiB parts beside a 19.5 MiB tree were refused; 38 MiB parts went through. The trees
are real git checkouts in tmp_path: tracked and untracked-not-ignored files count, ignored ones do not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "device" / "part_size.py"
sys.path.insert(0, str(SCRIPT.parent))

import part_size  # noqa: E402

MIB = 2**20


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/.wheelhouse/\n")
    return repo


def test_session_af_sizes_are_told_apart():
    tree = int(19.5 * MIB)
    assert part_size.part_size(tree) < 44  # refused on the GPU host
    assert part_size.part_size(tree) >= 38  # carried on the GPU host
    assert part_size.part_size(0, limit=200 * MIB) == part_size.MAX_PART_MIB  # never above bundle build's default


def test_tracked_and_untracked_count_and_ignored_does_not(tmp_path):
    repo = git_repo(tmp_path)
    (repo / "tracked.bin").write_bytes(b"\0" * (10 * MIB))
    subprocess.run(["git", "-C", str(repo), "add", "tracked.bin", ".gitignore"], check=True)
    (repo / "untracked.bin").write_bytes(b"\0" * (5 * MIB))
    (repo / ".wheelhouse").mkdir()
    (repo / ".wheelhouse" / "part-000.whl").write_bytes(b"\0" * (30 * MIB))
    got = part_size.tree_bytes(repo)
    assert 15 * MIB <= got < 15 * MIB + 4096
    r = run(str(repo))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == part_size.part_size(got) == (part_size.LIMIT_BYTES - got) // MIB - part_size.MARGIN_MIB
    r = run("--explain", str(repo))
    assert r.returncode == 0 and "tree 15.0 MiB" in r.stdout and f"parts of {part_size.part_size(got)} MiB" in r.stdout


def test_a_tree_too_large_is_one_sentence(tmp_path):
    repo = git_repo(tmp_path)
    (repo / "big.bin").write_bytes(b"\0" * (56 * MIB))
    r = run(str(repo))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "the working tree is 56.0 MiB" in r.stderr and "ignored folder" in r.stderr


def test_not_a_checkout_is_one_sentence(tmp_path):
    r = run(str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a git checkout" in r.stderr


def test_kit_prints_the_bundle_command_with_this_trees_size(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "device" / "kit.sh"), str(tmp_path / "kit")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want = run(str(ROOT)).stdout.strip()
    assert f"--part-size {want}" in r.stdout.splitlines()[-1]
