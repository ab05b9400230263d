"""The real CUDA 12 builds of policy.toml, on a machine that reaches download.pytorch.org and GitHub.

Opt-in (large downloads): RFTSTACK_CUDA12_ARTIFACTS=DIR (a download cache, resumable);
skipped otherwise. Our build machines cannot reach those hosts, so this has not run here. Checks
what `rftstack flavour cuda12` would find on the real files before it changes anything: each
file's sha256 (the fetcher), every Requires-Dist of the four builds (after the policy's
[[cuda12.rewrite]]) met by what the CUDA 12 flavour of uv.lock holds, and no ELF file in them that
needs a CUDA 13 library (they need libcudart.so.12).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import pytest

from rftstack.bundle import fetch, flavour
from rftstack.stack import env_report, lockfile, policy
from rftstack.doctor.checks import elf

CACHE = os.environ.get("RFTSTACK_CUDA12_ARTIFACTS")
pytestmark = pytest.mark.skipif(not CACHE, reason="opt-in: set RFTSTACK_CUDA12_ARTIFACTS=DIR on a machine that reaches download.pytorch.org and GitHub")


@pytest.fixture(scope="module")
def artifacts() -> dict[str, Path]:
    """name -> the real build, downloaded (or found) in the cache with the policy's sha256."""
    out = {}
    for a in policy.load().artifacts:
        dest = Path(CACHE) / a.filename
        fetch.download(a.url, dest, a.sha256, a.size, source="policy.toml")
        out[a.name] = dest
    return out


def _python(pol: policy.Policy) -> str:
    tag = pol.cuda12.get("python", "cp312")
    return f"{tag[2]}.{tag[3:]}"


def test_requirements_of_the_real_builds_are_met_by_the_cuda12_flavour(artifacts):
    pol = policy.load()
    env = lockfile.target_environment(_python(pol))
    lock = lockfile.load()
    gone = {p.name for p in lock.packages if flavour.is_cuda13_only(p.name, pol)}
    after = {n: p.version for n, p in lock.resolve(env, groups=("dev", flavour.GROUP), exclude=gone).items()}
    after |= {policy.canonical(a.name): a.version for a in pol.artifacts}
    requires = {f"{a.name} {a.version}": flavour._rewritten(flavour.wheel_requires(artifacts[a.name]), policy.canonical(a.name), a.version, pol)
                for a in pol.artifacts}
    assert flavour.unmet(after, requires, env) == []
    assert env_report.expected(lock, pol, "cuda12").keys() >= {"nvidia-cuda-runtime-cu12", "torch"}


def test_no_file_of_the_real_builds_needs_cuda13(artifacts):
    needs: dict[str, set[str]] = {}
    for name, path in artifacts.items():
        with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory() as tmp:
            for member in z.namelist():
                if not (member.endswith(".so") or ".so." in member.rsplit("/", 1)[-1]):
                    continue
                extracted = Path(z.extract(member, tmp))
                links = elf.read_links(extracted)
                extracted.unlink()  # one at a time: torch's libraries are GBs unpacked
                if links is not None:
                    needs.setdefault(name, set()).update(links.needed)
                    assert (links.cuda_major or 0) < 13, f"{path.name}: {member} needs {links.needed}"
    assert "libcudart.so.12" in needs["torch"] and "libcudart.so.12" in needs["vllm"]
