"""Shared fixtures: real inputs (a tiny model made on the spot, the report's config), no mocks."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from helpers import FAKE_TRINITY, ServeRun, rftstack_env, write_report_config


def pytest_configure(config):
    """The processes the tests start get SIGINT's default, however the run was started. A shell leaves SIGINT and
    SIGQUIT ignored in what it starts in the background (`cmd &`, as a CI runner or `setsid ... &` may), and an ignored
    signal stays ignored across exec: every child would then ignore the SIGINT that the code under test stops it with,
    and each stop would wait out its grace period (20 s and more) before the next signal. A handler is reset to the
    default across exec, so this process's own (Python's KeyboardInterrupt) gives the children theirs."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A real tiny Qwen2 model directory (rftstack.run.tinymodel), made once per test session."""
    from rftstack.run import tinymodel

    return tinymodel.ensure(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def report_config(tmp_path, tiny_model) -> Path:
    return write_report_config(tmp_path / "qwen3b.yaml", tiny_model)


@pytest.fixture(scope="session")
def session_head(tmp_path_factory):
    """One real loopback Ray head shared by the supervision tests (they join it)."""
    from rftstack.run import ray_head

    head = ray_head.start(state_dir=tmp_path_factory.mktemp("head"), num_gpus=0, num_cpus=1)
    try:
        yield head
    finally:
        ray_head.stop(head, timeout=5, remove_temp=True)


@pytest.fixture
def serve_runner(tmp_path):
    runs: list[ServeRun] = []

    def start(args: list[str], fake: str = "", command: str = "serve", prefix: list[str] = (), **env_extra) -> ServeRun:
        env = rftstack_env(
            RFTSTACK_TRINITY_CMD=f"{sys.executable} {FAKE_TRINITY}",
            FAKE_TRINITY=fake,
            FAKE_TRINITY_PIDS=str(tmp_path / "fake-pids.json"),
            XDG_CACHE_HOME=str(tmp_path / "cache"),
            **env_extra,
        )
        run = ServeRun(args, env, tmp_path, tmp_path / f"run{len(runs)}", command=command, prefix=prefix)
        runs.append(run)
        return run

    yield start
    from rftstack.run import supervisor

    for run in runs:  # never leave a serve behind, also on failure
        run.kill()
        for tag in run.tags():
            supervisor.stop(tag=tag, first=9, grace_s=5)
