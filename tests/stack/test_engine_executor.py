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
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rftstack.stack import policy

from patch_helpers import installed_without

VAR = "RFTSTACK_ENGINE_EXECUTOR"
REL = "trinity/common/models/vllm_model.py"

# Child: for each config shape (JSON in argv[2]), the real prepare() of vLLMRolloutModel with the TEST
# DOUBLE engine factory; prints the executor backend of the engine args, or the error prepare raised.
PROBE = r"""
import asyncio, importlib.util, json, sys
import vllm
from trinity.common.config import InferenceModelConfig
if sys.argv[1] == "-":
    from trinity.common.models import vllm_model as mod
else:
    spec = importlib.util.spec_from_file_location("vllm_model_as_published", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)

class Captured(Exception):
    pass

class EngineFactoryDouble:
    '''TEST DOUBLE for vllm.AsyncLLMEngine.from_engine_args: records the args, builds no engine.'''
    @staticmethod
    def from_engine_args(engine_args):
        raise Captured(engine_args.distributed_executor_backend)

vllm.AsyncLLMEngine = EngineFactoryDouble
out = {}
for name, fields in json.loads(sys.argv[2]).items():
    base = dict(model_path="unused-by-the-double", temperature=1.0, top_p=1.0, top_k=-1, logprobs=0, max_model_len=512,
                max_prompt_tokens=256, max_response_tokens=256, min_response_tokens=0, enable_prompt_truncation=False,
                repetition_penalty=1.0)
    base["gpu_per_engine"] = fields.get("tensor_parallel_size", 1) * fields.get("pipeline_parallel_size", 1)
    model = mod.vLLMRolloutModel(InferenceModelConfig(**{**base, **fields}))
    try:
        asyncio.run(model.prepare())
        out[name] = "prepare returned without building an engine"
    except Captured as c:
        out[name] = c.args[0]
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print("PROBE " + json.dumps(out))
"""

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
    import os

    env = {k: v for k, v in os.environ.items() if k != VAR}
    if env_value is not None:
        env[VAR] = env_value
    return subprocess.run([sys.executable, "-c", PROBE, module, json.dumps(SHAPES)], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def chosen(out: subprocess.CompletedProcess) -> dict[str, str]:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):])


@pytest.fixture(scope="module")
def backends(published_module) -> dict[str, dict[str, str]]:
    """The executor each shape's engine args named: as published, patched (switch unset), mp and uni.
    The four children run two at a time (each is mostly its imports of vLLM and Trinity, one core)."""
    runs = {"published": (str(published_module), None), "patched": ("-", None), "mp": ("-", "mp"), "uni": ("-", "uni")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = {run: pool.submit(probe, *args) for run, args in runs.items()}
        return {run: chosen(future.result()) for run, future in done.items()}


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
