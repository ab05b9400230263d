"""tests/gpu/host_session.sh's engine3b-bisect: bare `vllm serve` with TRINITY_ENGINE_ARGS and TRINITY_LIKE_ARGS is
started with every engine argument Trinity's engine is built with, field by field, so that what still lies between
the two on the GPU host is how Trinity runs vLLM (a Ray actor, the API server in its event loop, the worker forked
from it), not an argument.

Real: the bench's serve config (bench/serve_vs_bare.py, the report's, as serve_profile.py writes it) loaded and
checked by Trinity's own config code; Trinity's installed vLLMRolloutModel.prepare() (with the policy's patches and
RFTSTACK_ENGINE_LOG_STATS=1, as the step runs it), which builds vLLM's real AsyncEngineArgs; and bare's argument
list as serve_profile.py builds it, parsed by vLLM's own `vllm serve` parser into AsyncEngineArgs. What stands in,
because no GPU exists here: a TEST DOUBLE for `vllm.AsyncLLMEngine.from_engine_args` (records the args, builds no
engine), and vLLM's CPU platform as the current platform while the CLI parser runs (it builds a DeviceConfig,
which needs one; no field compared depends on it).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import engine_table
import serve_profile as sp
from helpers import trinity_engine_args

REPO = Path(__file__).resolve().parents[2]

# Child: argv[1] a work dir, argv[2] bare's extra `vllm serve` words (JSON list). Prints the AsyncEngineArgs fields
# where Trinity's engine and bare differ, as {field: [trinity's repr, bare's repr]}, and vLLM's scheduler defaults.
PROBE = r"""
import asyncio, dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import serve_profile as sp
import serve_vs_bare as svb
work = Path(sys.argv[1]); extra = json.loads(sys.argv[2])
model = work / "model"
cfg_path = svb.trinity_config(work / "serve.yaml", model=model, label="bisect", max_model_len=sp.MAX_MODEL_LEN,
                              gpu_util=sp.GPU_UTIL, proxy_port=svb.free_port(), ckpt=work / "ckpt", db_url=None)
from trinity.common.config import load_config
cfg = load_config(str(cfg_path)); cfg.check_and_update()
import vllm
class Captured(Exception):
    pass
class EngineFactoryDouble:
    '''TEST DOUBLE for vllm.AsyncLLMEngine.from_engine_args: records the args, builds no engine.'''
    @staticmethod
    def from_engine_args(engine_args):
        raise Captured(engine_args)
vllm.AsyncLLMEngine = EngineFactoryDouble
from trinity.common.models.vllm_model import vLLMRolloutModel
try:
    asyncio.run(vLLMRolloutModel(cfg.explorer.rollout_model).prepare())
    raise SystemExit("prepare returned without building an engine")
except Captured as c:
    trinity = c.args[0]
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()  # stands in for the GPU's platform while the parser runs
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.config import SchedulerConfig
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
# bare_phase's argument list after `vllm serve MODEL --host --port`
argv = ["--model", str(model), "--gpu-memory-utilization", str(sp.GPU_UTIL), "--max-model-len", str(sp.MAX_MODEL_LEN), *extra]
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
bare = AsyncEngineArgs.from_cli_args(ns)
diff = {f.name: [repr(getattr(trinity, f.name)), repr(getattr(bare, f.name))] for f in dataclasses.fields(AsyncEngineArgs)
        if getattr(trinity, f.name) != getattr(bare, f.name)}
print("PROBE " + json.dumps({"diff": diff, "defaults": [SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS, SchedulerConfig.DEFAULT_MAX_NUM_SEQS],
                             "server_load_tracking": bool(getattr(ns, "enable_server_load_tracking", False))}))
"""


def like_args() -> str:
    """host_session.sh's TRINITY_LIKE_ARGS default."""
    return engine_table.host_session_defaults()[1]


def probe(tmp_path: Path, variant: str) -> dict:
    """Trinity's engine args against bare's for one --bare-variants entry, split as serve_profile.py splits it."""
    env_words, words = sp.split_variant(sp.bare_args(variant))
    assert env_words == {}
    env = {**os.environ, "RFTSTACK_ENGINE_LOG_STATS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), json.dumps(words), str(REPO / "bench")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):])


# fields that differ only in how "unset" is spelled, or that vLLM resolves to the value given (checked below)
SAME_MEANING = {"reasoning_parser": ["None", "''"], "reasoning_parser_plugin": ["None", "''"], "enable_lora": ["False", "None"]}


@pytest.fixture(scope="module")
def bisect(tmp_path_factory) -> dict:
    return probe(tmp_path_factory.mktemp("bisect"), f"{trinity_engine_args()} {like_args()}")


def test_bare_like_trinity_has_every_engine_argument_trinitys_engine_has(bisect):
    diff = dict(bisect["diff"])
    batched, seqs = bisect["defaults"]
    # Trinity leaves the batch sizes to vLLM (no usage context: the scheduler's defaults); bare names those values
    assert diff.pop("max_num_batched_tokens") == ["None", repr(batched)]
    assert diff.pop("max_num_seqs") == ["None", repr(seqs)]
    for name, pair in SAME_MEANING.items():
        if name in diff:
            assert diff.pop(name) == pair, name
    assert diff == {}, f"bare with TRINITY_ENGINE_ARGS and TRINITY_LIKE_ARGS still differs from Trinity's engine in {diff}"


def test_without_the_like_arguments_bare_differs_in_what_they_carry(tmp_path):
    """The comparison can fail: bare with TRINITY_ENGINE_ARGS only differs in the fields TRINITY_LIKE_ARGS sets."""
    diff = probe(tmp_path, trinity_engine_args())["diff"]
    for name in ("worker_cls", "trust_remote_code", "override_generation_config", "weight_transfer_config"):
        assert name in diff, name
    assert "TrinityGPUWorker" in diff["worker_cls"][0] and "'max_new_tokens': 1024" in diff["override_generation_config"][0]


def test_the_api_server_trinity_starts_tracks_load_and_so_does_bare_like_it(bisect):
    from trinity.common.models.vllm_patch import api_patch_v17

    src = inspect.getsource(api_patch_v17.run_api_server_in_ray_actor_v17)
    assert '"--enable-server-load-tracking",  # enable tracking for load balancing' in src
    assert bisect["server_load_tracking"] is True


def test_the_step_runs_the_serve_with_statistics_and_both_bare_variants():
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        engine3b-bisect) ", 1)[1].split(";;", 1)[0]
    assert "RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py" in step
    assert '--bare-variants "$TRINITY_ENGINE_ARGS;$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS"' in step
    assert "TRINITY_LIKE_ARGS=${TRINITY_LIKE_ARGS:-$TRINITY_LIKE_ARGS_DEFAULT}" in script
    # the variant's log file name stays a plain, short name (its JSON arguments' braces and quotes replaced)
    _, name = sp.variant_names(sp.bare_args(f"{trinity_engine_args()} {like_args()}"))
    assert len(name) <= 80 and all(ch.isalnum() or ch in "._-" for ch in name)


def test_the_context_step_runs_bare_like_trinity_as_it_is_with_the_actor_s_variables_and_in_a_ray_actor():
    """engine3b-context: four bare variants with every argument Trinity's, which differ only in what serve_profile
    passes to the process as its environment (TRINITY_ACTOR_ENV; RFTSTACK_VLLM_FORK_WORKERS=0) and in the launcher
    (@ray-actor: bench/vllm_in_ray.py), never in vLLM's arguments; after bench/process_context.py and the serve."""
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        engine3b-context) ", 1)[1].split(";;", 1)[0]
    assert '[ -n "${CONTEXT_NO_PROCESS:-}" ] || python3 bench/process_context.py' in step and " --bare --numeric" in step
    # Trinity's engine actor in the same run, its engine's statistics on (the steps/s to set beside the variants')
    assert "${CONTEXT_NO_SERVE:+--no-serve}" in step  # CONTEXT_NO_SERVE=1 leaves the serve out, as the docs say
    assert '--concurrency "${CONTEXT_LEVELS:-32,64}"' in step  # both levels unless a short session names one
    assert "--no-serve" not in step.replace("${CONTEXT_NO_SERVE:+--no-serve}", "")
    assert "RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py" in step
    assert 'like="$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS"' in step
    actor_env = engine_table.host_session_actor_env()
    assert '--bare-variants "$variants"' in step
    # with PY_SPY every server's worker, EngineCore and frontend are sampled in a window of numeric requests of its own
    assert '${PY_SPY:+--py-spy "$PY_SPY" --bare-profile-requests numeric}' in step and "numeric" in sp.PROFILE_REQUESTS
    (variants, short) = re.findall(r'variants="([^"]+)"', step)
    assert short == "$like;@ray-actor $like" and short.split(";") == [variants.split(";")[i] for i in (0, 2)]
    like = f"{trinity_engine_args()} {like_args()}"
    got = [sp.bare_argv("/m", 8000, 0.6, 2048, sp.bare_args(v.replace("$TRINITY_ACTOR_ENV", actor_env).replace("$like", like)))
           for v in variants.split(";")]
    (l0, argv0, env0), (l1, argv1, env1), (l2, argv2, env2), (l3, argv3, env3) = got
    assert (l0, l1, l2, l3) == ("vllm-serve", "vllm-serve", "ray-actor", "ray-actor")
    assert env0 == {} and env1 == dict(w.split("=", 1) for w in actor_env.split()) and env2 == {}
    assert env3 == {"RFTSTACK_VLLM_FORK_WORKERS": "0"}
    assert argv0 == argv1 and argv0[:2] == ["vllm", "serve"] and argv2 == argv3
    assert argv2[1].endswith("bench/vllm_in_ray.py") and argv2[2:] == argv0[2:]


def test_the_anyio_step_runs_the_serve_with_the_patch_off_then_on_beside_bare():
    """engine3b-anyio: the serve with RFTSTACK_ENGINE_ANYIO_ROOT=0 (upstream), then the serve with the patch on (the
    switch unset: the default) and bare with every engine argument Trinity's; the same levels, windows and requests."""
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        engine3b-anyio) ", 1)[1].split(";;", 1)[0]
    off, on = step.split("RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py")[1:]
    assert step.split("RFTSTACK_ENGINE_LOG_STATS=1")[0] == "wait; RFTSTACK_ENGINE_ANYIO_ROOT=0 "
    assert "RFTSTACK_ENGINE_ANYIO_ROOT" not in on and "--bare " not in off and "--bare --numeric" in on
    assert '--bare-variants "$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS"' in on
    for half in (off, on):
        assert "--concurrency 32,64 --window-s 12" in half and "--numeric" in half and '--py-spy "$PY_SPY"' in half
    assert "engine-anyio0-qwen3b.json" in off and "engine-anyio-qwen3b.json" in on
    assert "#   engine3b-anyio  patches/trinity-engine-anyio-root.patch under load" in script


def test_the_anyiocpu_step_runs_the_cpu_bench_with_its_plain_process_on_the_hosts_cpu():
    """anyiocpu: bench/anyio_root.py (the actor with the patch on and off, and the plain process) on the GPU host's
    CPU, six rounds so each order comes twice; it needs no GPU."""
    script = (REPO / "tests" / "gpu" / "host_session.sh").read_text()
    step = script.split("        anyiocpu) ", 1)[1].split(";;", 1)[0]
    assert step.startswith("python3 bench/anyio_root.py --out \"$LOGS/bench/anyio-root-host.json\" --rounds 6")
    assert "--requests 2000" in step and "--concurrency 32" in step and "wait" not in step
    assert "#   anyiocpu   bench/anyio_root.py on this host's CPU (no GPU)" in script
