"""Config values Trinity 0.6.0 or vLLM 0.23.0 would refuse, found in milliseconds before anything
loads: each key of ``model``, ``cluster``, ``explorer.rollout_model`` and ``synchronizer`` with a
type or range either of them enforces, and the combinations they check (GPUs needed against GPUs
present, prompt + response tokens against the context length, tool choice without a parser).

Where the rule comes from is named in each one (``source``): Trinity's config dataclasses and
``config_validator.py``, vLLM's ``CacheConfig``, ``ModelConfig``, ``SamplingParams`` and
``EngineArgs``. One FAIL finding per bad value, one line, with the fix.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any, Callable

from rftstack.dotted import UNSET as _UNSET
from rftstack.dotted import lookup
from rftstack.findings import FAIL, OK, Finding


# vLLM 0.23.0 vllm/config/model.py: ModelDType
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# trinity/common/constants.py SyncMethod / SyncStyle, aliases included (case-insensitive enums)
SYNC_METHODS = ("nccl", "checkpoint", "memory", "online", "offline")
SYNC_STYLES = ("fixed", "trainer_driven", "explorer_driven", "fully_async", "dynamic_by_explorer", "dynamic_by_trainer")
# trinity/common/models/allocator.py: engine types it can start
ENGINE_TYPES = ("vllm", "sglang", "tinker", "external")
ENGINE_ARGS_FILE = "engine/arg_utils.py"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_str(v: Any) -> bool:
    return isinstance(v, str)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A value rule: ``ok(value)`` for a set key; ``expect`` completes "needs ..."; ``example`` is a
    value that passes; ``source`` names who refuses it; ``nullable``: null means the default."""

    key: str
    ok: Callable[[Any], bool]
    expect: str
    example: str
    source: str
    nullable: bool = False


def _pos_int(v):
    return is_int(v) and v >= 1


def _nonneg_int(v):
    return is_int(v) and v >= 0


_T, _V, _VS = "Trinity's config", "vLLM's EngineArgs", "vLLM's SamplingParams"


def _sampling(prefix: str, nullable: bool) -> list[Rule]:
    return [
        Rule(f"{prefix}.temperature", lambda v: is_num(v) and v >= 0, "a number >= 0", "1.0", _VS, nullable),
        Rule(f"{prefix}.top_p", lambda v: is_num(v) and 0 < v <= 1, "a number above 0 and at most 1", "1.0", _VS, nullable),
        Rule(f"{prefix}.top_k", lambda v: is_int(v) and v >= -1, "an integer, -1 or 0 (off) or at least 1", "-1", _VS, nullable),
        Rule(f"{prefix}.logprobs", lambda v: is_int(v) and v >= -1, "an integer >= 0 (-1: all)", "0", _VS, nullable),
        Rule(f"{prefix}.repetition_penalty", lambda v: is_num(v) and v > 0, "a number above 0", "1.0", _VS, nullable),
        Rule(f"{prefix}.max_model_len", _pos_int, "a positive number of tokens", "4096", _V, True),
        Rule(f"{prefix}.max_prompt_tokens", _pos_int, "a positive number of tokens", "2048", _T, True),
        Rule(f"{prefix}.max_response_tokens", _pos_int, "a positive number of tokens", "2048", _T, True),
        Rule(f"{prefix}.min_response_tokens", _nonneg_int, "a number of tokens >= 0", "0", _T, nullable),
        Rule(f"{prefix}.enable_prompt_truncation", is_bool, "true or false", "true", _T, nullable),
        Rule(f"{prefix}.enable_thinking", is_bool, "true or false", "false", _T, True),
        Rule(f"{prefix}.trust_remote_code", is_bool, "true or false", "false", _T),
    ]


RULES: tuple[Rule, ...] = (
    Rule("model.model_path", lambda v: is_str(v) and v != "", "the path of a local model directory", "/models/Qwen2.5-3B-Instruct", _T),
    Rule("model.critic_model_path", is_str, "a path (a string)", "''", _T, True),
    *_sampling("model", False),
    Rule("model.rope_theta", lambda v: is_num(v) and v > 0, "a number above 0", "1000000.0", _V, True),
    Rule("model.rope_scaling", lambda v: isinstance(v, dict), "a mapping", "{rope_type: yarn, factor: 4.0}", _V, True),
    Rule("cluster.ray_address", is_str, "an address string", "auto", _T),
    Rule("cluster.node_num", _nonneg_int, "a whole number of nodes (0: ask Ray)", "1", _T),
    Rule("cluster.gpu_per_node", _nonneg_int, "a whole number of GPUs (0: ask Ray)", "1", _T),
    Rule("explorer.rollout_model.model_path", lambda v: is_str(v) and v != "", "the path of a local model directory", "/models/Qwen2.5-3B-Instruct", _T, True),
    Rule("explorer.rollout_model.engine_type", lambda v: v in ENGINE_TYPES, "one of " + ", ".join(ENGINE_TYPES), "vllm", _T),
    Rule("explorer.rollout_model.engine_num", _pos_int, "at least 1 engine (with none, no request can be answered)", "1", "Trinity's serve mode"),
    Rule("explorer.rollout_model.tensor_parallel_size", _pos_int, "an integer >= 1", "1", _T),
    Rule("explorer.rollout_model.data_parallel_size", _pos_int, "an integer >= 1", "1", _T),
    Rule("explorer.rollout_model.pipeline_parallel_size", _pos_int, "an integer >= 1", "1", _T),
    Rule("explorer.rollout_model.gpu_memory_utilization", lambda v: is_num(v) and 0 < v <= 1,
         "the fraction of each GPU's memory vLLM may use, above 0 and at most 1", "0.6", "vLLM's CacheConfig"),
    Rule("explorer.rollout_model.dtype", lambda v: v in VLLM_DTYPES, "one of " + ", ".join(VLLM_DTYPES), "bfloat16", "vLLM's ModelConfig"),
    Rule("explorer.rollout_model.seed", is_int, "an integer", "42", _V),
    Rule("explorer.rollout_model.enforce_eager", is_bool, "true or false", "false", _V),
    Rule("explorer.rollout_model.enable_prefix_caching", is_bool, "true or false", "true", _V),
    Rule("explorer.rollout_model.enable_chunked_prefill", is_bool, "true or false", "true", _V),
    Rule("explorer.rollout_model.enable_expert_parallel", is_bool, "true or false", "false", _V),
    Rule("explorer.rollout_model.enable_openai_api", is_bool, "true or false", "true", _T),
    Rule("explorer.rollout_model.enable_log_requests", is_bool, "true or false", "false", _V),
    Rule("explorer.rollout_model.enable_history", is_bool, "true or false", "false", _T),
    Rule("explorer.rollout_model.enable_auto_tool_choice", is_bool, "true or false", "false", _V),
    Rule("explorer.rollout_model.ignore_eos", is_bool, "true or false", "false", _VS),
    Rule("explorer.rollout_model.enable_lora", is_bool, "true or false", "false", _V),
    Rule("explorer.rollout_model.tool_call_parser", is_str, "a parser name", "hermes", _V, True),
    Rule("explorer.rollout_model.reasoning_parser", is_str, "a parser name", "deepseek_r1", _V, True),
    Rule("explorer.rollout_model.chat_template", is_str, "a Jinja template string", "null", _T, True),
    Rule("explorer.rollout_model.api_key", is_str, "a string", "EMPTY", _T),
    Rule("explorer.rollout_model.base_port", lambda v: is_int(v) and 1 <= v <= 65535, "a port number 1-65535", "8100", _T, True),
    Rule("explorer.rollout_model.weight_sync_buffer_size", _pos_int, "a positive number of MB", "1024", _T),
    Rule("explorer.rollout_model.extra_engine_args", lambda v: isinstance(v, dict), "a mapping of vLLM engine arguments", "{max_num_seqs: 256}", _V),
    *_sampling("explorer.rollout_model", True),
    Rule("synchronizer.sync_method", lambda v: is_str(v) and v.lower() in SYNC_METHODS, "one of nccl, checkpoint, memory", "checkpoint", _T),
    Rule("synchronizer.sync_style", lambda v: is_str(v) and v.lower() in SYNC_STYLES, "one of fixed, trainer_driven, explorer_driven, fully_async", "fixed", _T),
    Rule("synchronizer.sync_interval", _pos_int, "an integer >= 1", "1", _T),
    Rule("synchronizer.explorer_sync_interval", _pos_int, "an integer >= 1", "1", _T, True),
    Rule("synchronizer.trainer_sync_interval", _pos_int, "an integer >= 1", "1", _T, True),
    Rule("synchronizer.sync_offset", _nonneg_int, "an integer >= 0", "0", _T),
    Rule("synchronizer.sync_timeout", _pos_int, "a positive number of seconds (the proxy also waits this long for an answer)", "3600", _T),
    Rule("synchronizer.wait_for_checkpoint", is_bool, "true or false", "false", _T),
)


def _fail(key: str, message: str, fix: str, value=None) -> Finding:
    return Finding("config.value", FAIL, message, fix, {"key": key, "value": value})


def check_rules(cfg: dict, rules=RULES) -> list[Finding]:
    out = []
    for r in rules:
        v = lookup(cfg, r.key)
        if v is _UNSET or (v is None and r.nullable):
            continue
        if v is None or not r.ok(v):
            out.append(_fail(r.key, f"`{r.key}` is {v!r}, but {r.source} needs {r.expect}.",
                             f"Set `{r.key}: {r.example}` (or remove it for the default).", v))
    return out


def engine_arg_names(vllm_root: Path | None) -> set[str] | None:
    """The field names of vLLM's EngineArgs/AsyncEngineArgs dataclasses (its arg_utils.py, read with ast)."""
    if vllm_root is None or not (vllm_root / ENGINE_ARGS_FILE).is_file():
        return None
    names: set[str] = set()
    for node in ast.parse((vllm_root / ENGINE_ARGS_FILE).read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in ("EngineArgs", "AsyncEngineArgs"):
            names |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return names or None


def _num(cfg: dict, key: str, default):
    v = lookup(cfg, key)
    return v if is_num(v) else default


def check_combinations(cfg: dict, *, gpus_present: int | None, model_max_len: int | None,
                       engine_args: set[str] | None) -> list[Finding]:
    """Rules over several keys (run after check_rules: a value of the wrong type is skipped here)."""
    out = []
    rm = "explorer.rollout_model"
    engine_num = _num(cfg, f"{rm}.engine_num", 1)
    per = 1
    for k in ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size"):
        per *= max(1, int(_num(cfg, f"{rm}.{k}", 1)))
    need = int(engine_num) * per
    nodes, gpn = _num(cfg, "cluster.node_num", 0), _num(cfg, "cluster.gpu_per_node", 0)
    if nodes and gpn:
        have, where = int(nodes * gpn), f"cluster.node_num x cluster.gpu_per_node = {int(nodes)} x {int(gpn)}"
        if need > have:
            out.append(_fail("cluster", f"The engines need {need} GPU(s) (engine_num {engine_num} x tensor/data/pipeline parallel {per}) but {where} gives {have}, which Trinity refuses.",
                             f"Lower `{rm}.engine_num` or the parallel sizes, or raise `cluster.gpu_per_node`.", need))
        if gpus_present is not None and int(nodes) == 1 and gpn > gpus_present:
            out.append(_fail("cluster.gpu_per_node", f"`cluster.gpu_per_node` is {gpn} but this machine has {gpus_present} GPU(s), so Ray can never place the engines.",
                             f"Set `cluster.gpu_per_node: {max(gpus_present, 1)}`.", gpn))
    elif gpus_present is not None and need > gpus_present:
        out.append(_fail("cluster", f"The engines need {need} GPU(s) (engine_num {engine_num} x tensor/data/pipeline parallel {per}) but this machine has {gpus_present}, so Ray can never place them.",
                         f"Lower `{rm}.engine_num` or the parallel sizes to fit {gpus_present} GPU(s).", need))
    for prefix in ("model", rm):
        mml, mp, mr = (_num(cfg, f"{prefix}.{k}", None) for k in ("max_model_len", "max_prompt_tokens", "max_response_tokens"))
        if mml and mp and mr and mp + mr > mml:
            out.append(_fail(f"{prefix}.max_model_len", f"`{prefix}.max_prompt_tokens` + `max_response_tokens` ({mp} + {mr}) exceed `max_model_len` ({mml}), which Trinity refuses.",
                             f"Lower them so they add up to at most {mml}, or raise `{prefix}.max_model_len`.", mml))
        if mml and model_max_len and mml > model_max_len:
            out.append(_fail(f"{prefix}.max_model_len", f"`{prefix}.max_model_len` {mml} exceeds the model's max_position_embeddings {model_max_len}, which vLLM refuses.",
                             f"Set `{prefix}.max_model_len` to at most {model_max_len}.", mml))
    if lookup(cfg, f"{rm}.enable_auto_tool_choice") is True and lookup(cfg, f"{rm}.tool_call_parser") in (_UNSET, None):
        out.append(_fail(f"{rm}.tool_call_parser", f"`{rm}.enable_auto_tool_choice` is true without `tool_call_parser`, which vLLM refuses.",
                         f"Set `{rm}.tool_call_parser` (e.g. `hermes` for Qwen) or turn tool choice off.", None))
    extra = lookup(cfg, f"{rm}.extra_engine_args")
    if isinstance(extra, dict) and engine_args:
        for k in sorted(k for k in extra if k not in engine_args):
            out.append(_fail(f"{rm}.extra_engine_args.{k}", f"`{rm}.extra_engine_args.{k}` is not an argument of vLLM's EngineArgs, so vLLM refuses to start (TypeError).",
                             "Remove it or correct its name (vLLM's engine arguments are its `vllm serve --help` options with _ for -).", k))
    return out


def check(cfg: dict, *, gpus_present: int | None = None, model_max_len: int | None = None,
          engine_args: set[str] | None = None) -> list[Finding]:
    """Every value finding for ``cfg`` (the raw YAML); one OK line when there is none."""
    out = check_rules(cfg)
    out += check_combinations(cfg, gpus_present=gpus_present, model_max_len=model_max_len, engine_args=engine_args)
    if not out:
        out.append(Finding("config.value", OK, f"Every value of model, cluster, explorer.rollout_model and synchronizer is of a type and range Trinity and vLLM accept ({len(RULES)} rules).", ""))
    return out
