"""bench/closure_size.py on the real uv.lock and policy.toml."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
import closure_size  # noqa: E402

from rftstack.stack import lockfile
from rftstack.stack import policy  # noqa: E402


def test_cuda13_walk_is_lockfile_resolve_and_driver570_drops_every_cuda13_dist():
    lock, pol = lockfile.load(), policy.load()
    env = lockfile.target_environment("3.12")
    dropped = {policy.canonical(d["dist"]) for d in pol.cuda12["drop"]}
    c13 = closure_size.walk(lock, env, (), set())
    assert set(c13) == set(lock.resolve(env))
    c12 = closure_size.walk(lock, env, (), dropped)
    assert set(c12) < set(c13) and not (set(c12) & dropped)
    assert {"torch", "vllm", "trinity-rft", "verl"} <= set(c12)


def test_report_sums_the_picked_wheels():
    r = closure_size.report("3.12", (), None)
    assert r["cuda13"]["bytes"] == r["driver570"]["bytes"] + r["driver570_removed"]["bytes"]
    assert r["driver570"]["no_size"] == [] and r["cuda13"]["largest"][0]["bytes"] > 100_000_000
    # the cp312 pick for a compiled package is a cp312 (or abi3) wheel
    lock = lockfile.load()
    ranking = {t: i for i, t in enumerate(closure_size.wheel_tags("3.12"))}
    numpy = next(p for p in lock.packages if p.name == "numpy")
    assert "cp312" in closure_size.pick_wheel(numpy, ranking).filename
