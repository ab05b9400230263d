"""Shared test code for the patch tests: temporary site-packages holding copies of the installed torch's and
trinity-rft's real files (as published: un-patched with the policy patch's reverse when the venv's copy is patched
already, as in CI after `rftstack relax`) and their real dist-info. The venv itself is never written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rftstack.stack import patches
from rftstack.stack import policy

TORCH_REL = "torch/distributed/rendezvous.py"


def installed_without(patch_file: str, rel: str, tmp_dir: Path, name: str) -> tuple[str, Path]:
    """The installed Trinity's ``rel`` with the one policy patch ``patch_file`` reversed (the others
    kept), written to ``tmp_dir/name``: (the installed text, the path of the copy)."""
    import trinity

    installed = (Path(trinity.__file__).parents[1] / rel).read_text()
    path = tmp_dir / name
    path.write_text(patches.undo(installed, patches.patches_dir() / patch_file, rel))
    return installed, path


def torch_patch():
    (p,) = [p for p in policy.load().patches if p.dist == "torch"]
    return p


def original_rendezvous() -> str:
    import torch

    text = (Path(torch.__file__).parent / "distributed" / "rendezvous.py").read_text()
    text = patches.undo(text, patches.patches_dir() / torch_patch().file, TORCH_REL)
    assert "_loopback_listen_fd" not in text
    return text


def add_torch(site: Path) -> Path:
    import torch

    real_site = Path(torch.__file__).parent.parent
    (site / "torch" / "distributed").mkdir(parents=True)
    (site / TORCH_REL).write_text(original_rendezvous())
    real_info = next(real_site.glob("torch-*.dist-info"))
    shutil.copytree(real_info, site / real_info.name, ignore=shutil.ignore_patterns("licenses", "LICENSE*"))
    return site


TRINITY_FILES = ("trinity/manager/synchronizer.py", "trinity/explorer/explorer.py", "trinity/explorer/proxy/app.py",
                 "trinity/explorer/proxy/service.py", "trinity/explorer/proxy/recorder.py", "trinity/buffer/storage/sql.py",
                 "trinity/algorithm/sample_strategy/sample_strategy.py", "trinity/cli/launcher.py",
                 "trinity/common/models/vllm_model.py", "trinity/common/models/vllm_patch/api_patch_v17.py")


def trinity_patches():
    return [p for p in policy.load().patches if p.dist == "trinity-rft"]


def add_trinity(site: Path) -> None:
    """The installed trinity-rft's files that policy patches touch (un-patched), with its dist-info."""
    import trinity

    real_site = Path(trinity.__file__).parents[1]
    texts = {rel: (real_site / rel).read_text() for rel in TRINITY_FILES}
    for p in reversed(trinity_patches()):  # undo in the reverse order of application
        for rel in texts:
            texts[rel] = patches.undo(texts[rel], patches.patches_dir() / p.file, rel)
    for rel, text in texts.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    real_info = next(real_site.glob("trinity_rft-*.dist-info"))
    (site / real_info.name).mkdir()
    shutil.copy(real_info / "METADATA", site / real_info.name / "METADATA")
    (site / real_info.name / "RECORD").write_text("".join(f"{rel},,\n" for rel in TRINITY_FILES))


def add_trinity_proxy(site: Path) -> Path:
    """Trinity's real (unpatched) files under ``site``; the path of its proxy app.py."""
    add_trinity(site)
    return site / "trinity/explorer/proxy/app.py"


VERL_REL = "verl/utils/attention_utils.py"
RAY_REL = "ray/_private/services.py"
VLLM_RELS = ("vllm/entrypoints/openai/chat_completion/serving.py", "vllm/v1/engine/logprobs.py")
VLLM_FORK_REL = "vllm/utils/system_utils.py"  # vllm-fork-workers.patch


def add_dist_file(site: Path, module: str, dist: str, *rels: str) -> Path:
    """The installed ``module``'s files ``rels`` (each un-patched with the reverse of ``dist``'s policy
    patches' hunks for it when the venv's copy is patched) with the distribution's dist-info (METADATA
    and a RECORD naming those files): enough for rftstack's patch machinery."""
    import importlib.util

    spec = importlib.util.find_spec(module)  # found, not imported (an import of Ray or vLLM takes seconds)
    assert spec is not None and spec.origin, f"{module} is not installed"
    real_site = Path(spec.origin).parents[1]
    own = [p for p in policy.load().patches if p.dist == dist]
    for rel in rels:
        text = (real_site / rel).read_text()
        for p in reversed(own):  # undo in the reverse order of application
            text = patches.undo(text, patches.patches_dir() / p.file, rel)
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    real_info = next(real_site.glob(f"{dist.replace('-', '_')}-*.dist-info"))
    (site / real_info.name).mkdir()
    shutil.copy(real_info / "METADATA", site / real_info.name / "METADATA")
    (site / real_info.name / "RECORD").write_text("".join(f"{rel},,\n" for rel in rels))
    return site


def add_verl(site: Path) -> Path:
    """The installed verl's attention_utils.py (un-patched) with verl's dist-info."""
    return add_dist_file(site, "verl", "verl", VERL_REL)


def add_ray(site: Path) -> Path:
    """The installed Ray's _private/services.py (un-patched) with Ray's dist-info."""
    return add_dist_file(site, "ray", "ray", RAY_REL)


def add_vllm(site: Path) -> Path:
    """The installed vLLM's patched files (un-patched) with vLLM's dist-info."""
    return add_dist_file(site, "vllm", "vllm", *VLLM_RELS, VLLM_FORK_REL)


# Child: for each config shape (JSON in argv[2]), the real prepare() of Trinity's vLLMRolloutModel (the installed
# module with "-" in argv[1], else the file there) with a TEST DOUBLE engine factory (an engine needs a GPU); prints
# the engine args' attribute argv[3] as prepare chose it, or the error prepare raised.
ENGINE_ARGS_PROBE = r"""
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
        raise Captured(getattr(engine_args, sys.argv[3]))

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


def probe_engine_args(module: str, shapes: dict, attr: str, var: str, value: str | None) -> subprocess.CompletedProcess:
    """ENGINE_ARGS_PROBE in a child whose environment has ``var`` set to ``value`` (None: unset); the switches
    are read when vllm_model.py is imported."""
    env = {k: v for k, v in os.environ.items() if k != var}
    if value is not None:
        env[var] = value
    return subprocess.run([sys.executable, "-c", ENGINE_ARGS_PROBE, module, json.dumps(shapes), attr], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip


def probed(out: subprocess.CompletedProcess) -> dict:
    """The shapes' attribute values a probe_engine_args child printed."""
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):])
