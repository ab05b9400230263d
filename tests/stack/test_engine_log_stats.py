"""patches/trinity-engine-log-stats.patch: with RFTSTACK_ENGINE_LOG_STATS=1 Trinity's engine keeps vLLM's
statistics (disable_log_stats False, as `vllm serve` by default: its /metrics counts engine steps, tokens per
step, running requests, per request the frontend's time against the time scheduled); unset or 0, disabled as
upstream; another value stops the import of vllm_model.py (so the engine actor's start) with one sentence.

Real: Trinity's installed vLLMRolloutModel (with the policy's patches, `rftstack relax`) and its prepare(),
which builds vLLM's real AsyncEngineArgs; and the same module as published (this patch reversed from the
installed vllm_model.py, into a private module), each in a child process (the switch is read when the module
is imported). What stands in: a TEST DOUBLE for `vllm.AsyncLLMEngine.from_engine_args` (an engine needs a
GPU): it records the engine args prepare chose and stops prepare there. What the statistics say about a
window under load is bench/serve_profile.py's part on the GPU host (tests/gpu/host_session.sh engine3b-stats).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from rftstack.stack import policy

from patch_helpers import installed_without, probe_engine_args, probed

VAR = "RFTSTACK_ENGINE_LOG_STATS"
REL = "trinity/common/models/vllm_model.py"
SHAPES = {"one_gpu": {}, "tp2": {"tensor_parallel_size": 2}}


@pytest.fixture(scope="module")
def published_module(tmp_path_factory) -> Path:
    """The installed vllm_model.py with this patch reversed: Trinity's as published (the other patches kept)."""
    (p,) = [p for p in policy.load().patches if p.file == "trinity-engine-log-stats.patch"]
    installed, path = installed_without(p.file, REL, tmp_path_factory.mktemp("published"), "vllm_model_as_published.py")
    assert f'LOG_STATS_VAR = "{VAR}"' in installed, "the installed Trinity lacks the log-stats patch: run `rftstack relax`"
    text = path.read_text()
    assert VAR not in text and "disable_log_stats=True," in text
    return path


@pytest.fixture(scope="module")
def disabled(published_module) -> dict[str, dict]:
    """disable_log_stats as each run's prepare() built it: as published (switch set to 1, which it ignores),
    patched with the switch unset, 0 and 1. Two children at a time (each mostly imports vLLM and Trinity)."""
    runs = {"published": (str(published_module), "1"), "unset": ("-", None), "0": ("-", "0"), "1": ("-", " 1 ")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = {run: pool.submit(probe_engine_args, module, SHAPES, "disable_log_stats", VAR, value)
                for run, (module, value) in runs.items()}  # fmt: skip
        return {run: probed(future.result()) for run, future in done.items()}


def test_as_published_and_by_default_the_engine_keeps_no_statistics(disabled):
    for run in ("published", "unset", "0"):
        assert disabled[run] == {"one_gpu": True, "tp2": True}, run


def test_switch_on_the_engine_keeps_vllms_statistics_as_vllm_serve_does(disabled):
    assert disabled["1"] == {"one_gpu": False, "tp2": False}
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert AsyncEngineArgs(model="m").disable_log_stats is False  # `vllm serve`'s default, which the switch matches


def test_a_bad_value_stops_the_import_with_a_sentence():
    out = probe_engine_args("-", SHAPES, "disable_log_stats", VAR, "yes")
    assert out.returncode != 0
    assert f"{VAR} must be 1 (the engine keeps vLLM's statistics: its /metrics and its throughput log line) or 0" in out.stderr
    assert "not 'yes'" in out.stderr


def test_switch_values():
    from trinity.common.models import vllm_model

    assert vllm_model.LOG_STATS_VAR == VAR, "the installed Trinity lacks the log-stats patch: run `rftstack relax`"
    assert vllm_model.engine_log_stats({}) is False
    assert vllm_model.engine_log_stats({VAR: "0"}) is False
    assert vllm_model.engine_log_stats({VAR: "1"}) is True
    with pytest.raises(ValueError, match=f"{VAR} must be 1 .* or 0 .*not 'true'"):
        vllm_model.engine_log_stats({VAR: "true"})
