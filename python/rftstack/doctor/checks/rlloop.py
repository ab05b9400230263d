"""The RL loop: will a served engine ever pick up a new checkpoint?

Trinity's ``ExplorerService.model_weights_sync_loop`` (trinity/explorer/proxy/service.py) takes an
engine out of service to reload weights only while
``len(self.running_model_ids) > explorer.min_running_model_num``. With ``engine_num: 1`` and the
default ``min_running_model_num: 1`` that is ``1 > 1``: never, and nothing is logged. The doctor
finds that comparison in the installed Trinity's source (``ast``) before saying so.
"""

from __future__ import annotations

import ast

from rftstack.findings import OK, WARN, Finding

SERVICE = "explorer/proxy/service.py"
DEFAULT_MIN_RUNNING = 1  # trinity ExplorerConfig.min_running_model_num
DEFAULT_ENGINE_NUM = 1  # trinity InferenceModelConfig.engine_num


def sync_gate(source: str) -> int | None:
    """Line of ``len(self.running_model_ids) > ...min_running_model_num`` inside
    ``model_weights_sync_loop``, or None if this Trinity has no such gate."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == "model_weights_sync_loop":
            for c in ast.walk(node):
                if (isinstance(c, ast.Compare) and len(c.ops) == 1 and isinstance(c.ops[0], ast.Gt)
                        and "running_model_ids" in ast.unparse(c.left) and "min_running_model_num" in ast.unparse(c.comparators[0])):
                    return c.lineno
    return None


def check(engine_num: int, min_running: int, min_running_set: bool, gate_line: int | None, mode: str = "serve") -> list[Finding]:
    if mode != "serve":
        return []
    where = f"trinity/{SERVICE}:{gate_line} (ExplorerService.model_weights_sync_loop)"
    if gate_line is None:
        return [Finding("rl-loop.weight_sync", WARN, f"The installed Trinity has no min_running_model_num gate in {SERVICE}; this is not Trinity 0.6.0, so the doctor cannot judge weight sync.",
                        "Install the locked trinity-rft 0.6.0.")]
    data = {"engine_num": engine_num, "min_running_model_num": min_running, "set_by_user": min_running_set, "source": where}
    if engine_num > min_running:
        return [Finding("rl-loop.weight_sync", OK, f"With engine_num {engine_num} > min_running_model_num {min_running}, Trinity reloads new checkpoints one engine at a time.", "", data)]
    who = "you set" if min_running_set else "Trinity's default"
    serve_note = ("; `rftstack serve` keeps your value" if min_running_set
                  else "; `rftstack serve` sets it to 0 for you, plain `trinity run` does not")
    return [Finding("rl-loop.weight_sync", WARN,
                    f"With engine_num {engine_num} and explorer.min_running_model_num {min_running} ({who}), the served model never loads a new checkpoint and says nothing: "
                    f"{where} reloads an engine only while more than min_running_model_num stay in service.",
                    f"Set `explorer.min_running_model_num: 0` (requests wait a few seconds while the engine reloads){serve_note}.", data)]
