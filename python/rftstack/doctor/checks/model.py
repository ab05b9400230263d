"""Model directory: files vLLM needs, an architecture the installed vLLM supports (its model
registry read with ``ast``, not imported), dtype, weight size against the GPU memory that
``gpu_memory_utilization`` leaves, and a chat template for the OpenAI endpoint.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from rftstack.findings import FAIL, OK, WARN, Finding

REGISTRY = "model_executor/models/registry.py"
GENERATIVE = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
MiB = 2**20


def registry_tables(source: str) -> dict[str, set[str]]:
    """Module-level ``_X_MODELS = {...}`` dict literals of vLLM's registry.py -> their string keys."""
    out = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id.endswith("_MODELS") and isinstance(value, ast.Dict):
            out[target.id] = {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return out


def supported(arch: str, tables: dict[str, set[str]]) -> str:
    """"yes", "previously" (removed from vLLM) or "no"."""
    if any(arch in tables.get(t, ()) for t in GENERATIVE):
        return "yes"
    if arch in tables.get("_PREVIOUSLY_SUPPORTED_MODELS", ()):
        return "previously"
    return "no"


def chat_template_source(d: Path) -> str | None:
    if (d / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    if (d / "chat_template.json").is_file():
        return "chat_template.json"
    try:
        tc = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return "tokenizer_config.json" if tc.get("chat_template") else None


def weight_files(d: Path) -> tuple[list[Path], list[Path]]:
    return sorted(d.glob("*.safetensors")), sorted(d.glob("pytorch_model*.bin"))


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def check(model_dir: str | None, *, registry_source: str | None, vllm_version: str = "?", gpu=None,
          gpu_memory_utilization: float = 0.9, max_model_len: int | None = None) -> list[Finding]:
    if not model_dir:
        return [Finding("model.path", FAIL, "The config sets no model.model_path.", "Set `model.model_path` to a local Hugging Face model directory.")]
    d = Path(model_dir)
    if d.is_file():
        return [Finding("model.path", FAIL, f"The model path {d} is a file, not a directory.",
                        f"Set `model.model_path` to the directory that holds it ({d.parent}) if that is the model directory, i.e. the one with config.json and the *.safetensors files.")]
    if not d.is_dir():
        return [Finding("model.path", FAIL, f"Model directory {d} does not exist.",
                        "Set `model.model_path` to the local directory that holds config.json and the *.safetensors files (a hub id needs network access at serve time).")]
    out = []
    try:
        cfg = json.loads((d / "config.json").read_text())
    except FileNotFoundError:
        return [Finding("model.config", FAIL, f"{d} has no config.json, so it is not a Hugging Face model directory.", "Point `model.model_path` at the directory that holds config.json.")]
    except ValueError as exc:
        return [Finding("model.config", FAIL, f"{d}/config.json is not valid JSON ({exc}).", "Re-download the model.")]
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    # architecture
    if arch is None:
        out.append(Finding("model.architecture", FAIL, f"{d}/config.json names no architectures.", "Re-download the model or add the `architectures` list to config.json."))
    elif registry_source is None:
        out.append(Finding("model.architecture", WARN, f"The model is a {arch}, and vLLM's registry ({REGISTRY}) could not be read to check it.", "Install the locked vllm."))
    else:
        s = supported(arch, registry_tables(registry_source))
        if s == "yes":
            out.append(Finding("model.architecture", OK, f"{arch} is in vllm {vllm_version}'s model registry.", "", {"architecture": arch}))
        elif s == "previously":
            out.append(Finding("model.architecture", FAIL, f"{arch} was removed from vllm {vllm_version} (listed as previously supported).", "Serve a model with a supported architecture, or an older vllm.", {"architecture": arch}))
        else:
            out.append(Finding("model.architecture", WARN, f"{arch} is not in vllm {vllm_version}'s model registry, so vLLM can only try its Transformers fallback.",
                               "Check the architecture in vLLM's supported-models list before serving it.", {"architecture": arch}))
    # tokenizer and chat template
    tok = [f for f in TOKENIZER_FILES if (d / f).is_file()]
    if not tok:
        out.append(Finding("model.tokenizer", FAIL, f"{d} has no tokenizer file ({', '.join(TOKENIZER_FILES)}).", "Copy the tokenizer files of the model into the directory."))
    else:
        tmpl = chat_template_source(d)
        if tmpl is None:
            out.append(Finding("model.chat_template", FAIL, f"The tokenizer in {d} has no chat template, so /v1/chat/completions fails for every request.",
                               "Use the instruct model's tokenizer files (tokenizer_config.json with chat_template, or chat_template.jinja)."))
        else:
            out.append(Finding("model.tokenizer", OK, f"Tokenizer ({', '.join(tok)}) with a chat template ({tmpl}).", ""))
    # weights
    st, bins = weight_files(d)
    size = sum(p.stat().st_size for p in st or bins)
    if not st and not bins:
        out.append(Finding("model.weights", FAIL, f"{d} holds no weights (*.safetensors).", "Download the model's *.safetensors files into the directory."))
    elif not st:
        out.append(Finding("model.weights", WARN, f"{d} has only pytorch_model*.bin weights ({size / 2**30:.1f} GiB), which load slowly and run pickle code.", "Convert them to safetensors."))
    else:
        out.append(Finding("model.weights", OK, f"{len(st)} safetensors file(s), {size / MiB:.1f} MiB, dtype {dtype}.", "", {"bytes": size, "dtype": dtype}))
    # dtype vs GPU
    gpus = list(getattr(gpu, "gpus", ()) or ())
    if dtype == "bfloat16" and gpus and gpus[0].compute_capability and gpus[0].compute_capability < (8, 0):
        out.append(Finding("model.dtype", WARN, f"The model is bfloat16 but {gpus[0].name} (compute capability {gpus[0].compute_capability[0]}.{gpus[0].compute_capability[1]}) has no bfloat16.",
                           "Set `explorer.rollout_model.dtype: float16`."))
    # context length
    mpe = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    if max_model_len and mpe and max_model_len > mpe:
        out.append(Finding("model.max_model_len", FAIL, f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {mpe}, which vLLM refuses.",
                           f"Set `model.max_model_len` to at most {mpe}."))
    # memory
    if gpus and gpus[0].total_mib and size:
        g = gpus[0]
        budget = g.total_mib * gpu_memory_utilization
        w = size / MiB
        data = {"weights_mib": round(w), "budget_mib": round(budget), "gpu_memory_utilization": gpu_memory_utilization, "total_mib": g.total_mib, "free_mib": g.free_mib}
        if w >= budget:
            out.append(Finding("model.memory", FAIL, f"The weights ({w:.0f} MiB) do not fit in the {budget:.0f} MiB that gpu_memory_utilization {gpu_memory_utilization} leaves on {g.name}.",
                               "Raise `explorer.rollout_model.gpu_memory_utilization`, use more GPUs (tensor_parallel_size) or a smaller model.", data))
        elif w > 0.8 * budget:
            out.append(Finding("model.memory", WARN, f"The weights ({w:.0f} MiB) take most of the {budget:.0f} MiB that gpu_memory_utilization {gpu_memory_utilization} leaves, so little is left for the KV cache.",
                               "Raise `explorer.rollout_model.gpu_memory_utilization` or lower `model.max_model_len`.", data))
        else:
            out.append(Finding("model.memory", OK, f"The weights ({w:.0f} MiB) fit in the {budget:.0f} MiB that gpu_memory_utilization {gpu_memory_utilization} leaves on {g.name}.", "", data))
        if g.free_mib is not None and g.free_mib < budget:
            out.append(Finding("model.free_memory", FAIL, f"{g.name} has {g.free_mib} MiB free, less than the {budget:.0f} MiB vLLM will claim (gpu_memory_utilization {gpu_memory_utilization}), so it refuses to start.",
                               "Stop what holds the GPU (see `nvidia-smi`) or lower `explorer.rollout_model.gpu_memory_utilization`.", data))
    return out
