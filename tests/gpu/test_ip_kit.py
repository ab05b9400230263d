"""tests/gpu/ip_kit.sh, run here (no GPU needed): the kit of iproute2's `ip` carried to a GPU host
that has none. The kit's `ip` runs with only its own directory and the standard tools on PATH; as
root it creates a network namespace and runs a command in it, and that command does not inherit a
library path; without `ip` the script says so in one sentence and exits 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ip_kit.sh")
PLAIN_PATH = "/usr/bin:/bin"  # no sbin: where Debian keeps `ip`

pytestmark = pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's `ip` here to build the kit")


def test_kit_runs_ip_with_its_own_libraries(tmp_path):
    out = tmp_path / "kit"
    made = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert "iproute2" in made.stdout
    assert (out / "ip.bin").read_bytes()[:4] == b"\x7fELF"
    assert any((out / "lib").iterdir()), "ip links libraries beyond glibc's"
    env = {"PATH": f"{out}:{PLAIN_PATH}"}
    assert subprocess.run(["ip", "-V"], env=env, capture_output=True, text=True).stdout.startswith("ip utility")
    if os.geteuid() != 0:
        pytest.skip("the namespace part needs root")
    ns = f"rfk{uuid.uuid4().hex[:8]}"
    added = subprocess.run(["ip", "netns", "add", ns], env=env, capture_output=True, text=True)
    if added.returncode != 0:
        pytest.skip(f"`ip netns add` does not work here ({added.stderr.strip()})")
    try:
        inside = subprocess.run(["ip", "netns", "exec", ns, "env"], env=env, capture_output=True, text=True, check=True)
        assert "LD_LIBRARY_PATH" not in inside.stdout
        links = subprocess.run(["ip", "-n", ns, "-o", "link"], env=env, capture_output=True, text=True, check=True)
        assert links.stdout.split()[1] == "lo:"
    finally:
        subprocess.run(["ip", "netns", "del", ns], env=env, capture_output=True)


def test_without_ip_one_sentence_and_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()  # a PATH with nothing on it: the script stops at its first step, finding `ip`
    bash = shutil.which("bash")
    assert bash
    out = subprocess.run([bash, str(SCRIPT), str(tmp_path / "kit")], env={"PATH": str(empty)}, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "install iproute2" in out.stderr
    assert not (tmp_path / "kit").exists()
