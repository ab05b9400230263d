"""Which CUDA flavour an environment holds, and which distributions belong to CUDA 13 only: the pure
decisions shared by `rftstack env`, the doctor, `rftstack flavour` and the bundle."""

from __future__ import annotations

from rftstack.stack import policy

CUDA12 = "cuda12"
GROUP = "cuda12"  # the dependency group of pyproject.toml / uv.lock with the CUDA 12 runtime libraries


def is_cuda13_only(name: str, pol: policy.Policy) -> bool:
    return name in pol.drop_names() or name.endswith("-cu13")


def installed_flavour(have: dict[str, str], pol: policy.Policy) -> str:
    """Pure: "cuda12" when every policy artifact is installed at its CUDA 12 version, "cuda13" when
    every one is at the version it replaces (PyPI's builds), "none" when none is installed, else "mixed"."""
    states = []
    for a in pol.artifacts:
        v = have.get(policy.canonical(a.name))
        states.append("cuda12" if v == a.version else "cuda13" if v == a.replaces else "none" if v is None else "other")
    if states and all(s == "cuda12" for s in states):
        return "cuda12"
    if states and all(s == "cuda13" for s in states):
        return "cuda13"
    if all(s == "none" for s in states):
        return "none"
    return "mixed"
