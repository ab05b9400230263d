"""patches/trinity-engine-uni-executor.patch: a user's extra_engine_args.distributed_executor_backend wins;
otherwise every engine is built with "mp" as upstream (the default, unset or RFTSTACK_ENGINE_EXECUTOR=mp), and
with RFTSTACK_ENGINE_EXECUTOR=uni an engine of one GPU on one node is built with vLLM's uni executor (the GPU
worker inside the EngineCore process, one process less to start), any other shape with "mp".

Real: Trinity's installed vLLMRolloutModel (with the policy's patches, `rftstack relax`) and its
prepare(), which builds vLLM's real AsyncEngineArgs; and the same module as published (this patch
reversed from the installed vllm_model.py, into a private module), each in a child process (the switch
is read when the module is imported). What stands in: a TEST DOUBLE for
`vllm.AsyncLLMEngine.from_engine_args` (an engine needs a GPU): it records the engine args prepare
chose and stops prepare there.

The upstream behaviour this guards: as published, every engine is built with "mp" (a worker process
beside the EngineCore even for one GPU), and a user's extra_engine_args.distributed_executor_backend
is a TypeError (the keyword given twice). The engine serving and reloading weights with the uni
executor on a GPU is tests/gpu/test_serve_gpu.py's part.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
from pathlib import Path

import pytest

from rftstack.stack import policy

from patch_helpers import installed_without, probe_engine_args, probed

VAR = "RFTSTACK_ENGINE_EXECUTOR"
REL = "trinity/common/models/vllm_model.py"

SHAPES = {
    "one_gpu": {},
    "tp2": {"tensor_parallel_size": 2},
    "pp2": {"pipeline_parallel_size": 2},
    "dp2": {"data_parallel_size": 2},
    "two_nodes": {"nnodes": 2},
    "user_mp": {"extra_engine_args": {"distributed_executor_backend": "mp"}},
    "user_ray_tp2": {"tensor_parallel_size": 2, "extra_engine_args": {"distributed_executor_backend": "ray"}},
}


def the_patch() -> policy.Patch:
    (p,) = [p for p in policy.load().patches if p.file == "trinity-engine-uni-executor.patch"]
    return p


@pytest.fixture(scope="module")
def published_module(tmp_path_factory) -> Path:
    """The installed vllm_model.py with this patch reversed: Trinity's as published."""
    installed, path = installed_without(the_patch().file, REL, tmp_path_factory.mktemp("published"), "vllm_model_as_published.py")
    assert f'EXECUTOR_VAR = "{VAR}"' in installed, "the installed Trinity lacks the executor patch: run `rftstack relax`"
    text = path.read_text()
    assert VAR not in text and 'distributed_executor_backend="mp",' in text
    return path


def probe(module: str, env_value: str | None) -> subprocess.CompletedProcess:
    return probe_engine_args(module, SHAPES, "distributed_executor_backend", VAR, env_value)


@pytest.fixture(scope="module")
def backends(published_module) -> dict[str, dict[str, str]]:
    """The executor each shape's engine args named: as published, patched (switch unset), mp and uni.
    The four children run two at a time (each is mostly its imports of vLLM and Trinity, one core)."""
    runs = {"published": (str(published_module), None), "patched": ("-", None), "mp": ("-", "mp"), "uni": ("-", "uni")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = {run: pool.submit(probe, *args) for run, args in runs.items()}
        return {run: probed(future.result()) for run, future in done.items()}


def test_as_published_every_engine_is_mp_and_a_users_backend_is_a_type_error(backends):
    pub = backends["published"]
    assert {k: pub[k] for k in ("one_gpu", "tp2", "pp2", "dp2", "two_nodes")} == dict.fromkeys(
        ("one_gpu", "tp2", "pp2", "dp2", "two_nodes"), "mp")
    for shape in ("user_mp", "user_ray_tp2"):
        assert pub[shape].startswith("TypeError") and "multiple values for keyword argument 'distributed_executor_backend'" in pub[shape]


def test_switch_uni_builds_one_gpu_on_one_node_with_uni_every_other_shape_mp(backends):
    assert backends["uni"] == {"one_gpu": "uni", "tp2": "mp", "pp2": "mp", "dp2": "mp", "two_nodes": "mp",
                               "user_mp": "mp", "user_ray_tp2": "ray"}  # fmt: skip


def test_by_default_and_with_mp_upstreams_executor_and_the_users_choice(backends):
    for run in ("patched", "mp"):
        assert backends[run] == {"one_gpu": "mp", "tp2": "mp", "pp2": "mp", "dp2": "mp", "two_nodes": "mp",
                                 "user_mp": "mp", "user_ray_tp2": "ray"}  # fmt: skip


def test_a_bad_value_stops_the_import_with_a_sentence():
    out = probe("-", "auto")
    assert out.returncode != 0
    assert f"{VAR} must be mp (a worker process per GPU, as upstream Trinity, the default) or uni" in out.stderr
    assert "not 'auto'" in out.stderr


def test_switch_values():
    from trinity.common.models import vllm_model

    assert vllm_model.EXECUTOR_VAR == VAR, "the installed Trinity lacks the executor patch: run `rftstack relax`"
    assert vllm_model.engine_executor_mode({}) == "mp"
    assert vllm_model.engine_executor_mode({VAR: " uni "}) == "uni"
    with pytest.raises(ValueError, match=f"{VAR} must be mp .* or uni .*not ''"):
        vllm_model.engine_executor_mode({VAR: ""})
