"""Config (-c): the YAML read in-process (a missing file or malformed YAML is one sentence), then
Trinity's own ``load_config(path).check_and_update()`` in a subprocess (it imports torch, ray and
verl), whose rewrites are reported as info and whose errors become findings with a fix.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rftstack.dotted import get
from rftstack.findings import FAIL, INFO, OK, WARN, Finding

PROBE = Path(__file__).with_name("_trinity_probe.py")
PROBE_MARK = "RFTSTACK-PROBE "


class ConfigFileError(Exception):
    """The config file cannot be read as a YAML mapping: one sentence for the problem, one for the fix."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem} {fix}")
        self.problem, self.fix = problem, fix


def load_yaml(path: str | os.PathLike) -> dict:
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(f"Config file {p} does not exist.", "Pass the path of your Trinity YAML with -c.") from None
    except IsADirectoryError:
        raise ConfigFileError(f"Config path {p} is a directory.", "Pass the YAML file inside it with -c.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"Config file {p} cannot be read ({exc}).", "Check its permissions and that it is UTF-8 text.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(f"Config file {p} is not valid YAML{where} ({problem}).", "Fix the indentation or quoting there.") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"Config file {p} holds a {type(data).__name__}, not a mapping of Trinity settings.", "Check that -c names your Trinity YAML.")
    return data


def model_path(cfg: dict, config_path: str | os.PathLike | None = None) -> str | None:
    p = get(cfg, "explorer.rollout_model.model_path") or get(cfg, "model.model_path")
    return p or None


# ---------------------------------------------------------------------------------------------
# Trinity's own validation, in a subprocess
# ---------------------------------------------------------------------------------------------

def cluster_sizes_fixed(cfg: dict) -> bool:
    """Whether the config sets both cluster.node_num and cluster.gpu_per_node (non-zero): only then
    does the probe not use the GPU count it is given (_trinity_probe.py assumes one where they are not)."""
    return bool(get(cfg, "cluster.node_num") and get(cfg, "cluster.gpu_per_node"))


class Probe:
    """_trinity_probe.py running in its own process group, started now and read later
    (``result``), or stopped unread (``cancel``): serve starts it beside its other preflight steps."""

    def __init__(self, config_path: str, gpus_per_node: int = 1, python: str | None = None, timeout: float = 300, cwd=None,
                 env: dict | None = None):  # fmt: skip
        self.config_path, self.gpus_per_node, self.timeout = str(config_path), gpus_per_node, timeout
        self.t0 = time.monotonic()
        # -P: do not put the probe's own directory (rftstack/checks, which has modules named like
        # the packages Trinity imports) in front of sys.path
        cmd = [python or sys.executable, "-P", str(PROBE), self.config_path, str(gpus_per_node)]
        self.out = tempfile.TemporaryFile(mode="w+")  # files, not pipes: nobody reads it while it runs
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL, text=True, cwd=cwd,
                                     env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}, start_new_session=True)  # fmt: skip

    def matches(self, config_path: str, gpus_per_node: int, cluster_fixed: bool) -> bool:
        """Whether this probe answers for ``config_path`` checked with ``gpus_per_node`` GPUs (which
        the probe uses only when the config leaves cluster.node_num or gpu_per_node out)."""
        return self.config_path == str(config_path) and (cluster_fixed or self.gpus_per_node == gpus_per_node)

    def cancel(self) -> None:
        """Stop the probe and its children (no-op once it has finished)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.out.close()
        self.err.close()

    def result(self) -> dict:
        """Its JSON result plus the log lines Trinity printed (waits for it, up to ``timeout`` from its start)."""
        try:
            self.proc.wait(timeout=max(0.0, self.timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.cancel()
            return {"error": f"Trinity's config check did not finish in {self.timeout:.0f} s", "error_type": "Timeout", "log": []}
        self.out.seek(0)
        self.err.seek(0)
        stdout, stderr = self.out.read(), self.err.read()
        self.cancel()
        return parse_probe(stdout, stderr, self.proc.returncode)


def run_probe(config_path: str, gpus_per_node: int = 1, python: str | None = None, timeout: float = 300, cwd=None) -> dict:
    """Run _trinity_probe.py with the stack's Python; its JSON result plus the log lines Trinity printed."""
    return Probe(config_path, gpus_per_node, python, timeout, cwd).result()


def parse_probe(stdout: str, stderr: str, returncode: int | None) -> dict:
    """The probe's JSON result (its PROBE_MARK line) plus every other line it printed, as ``log``."""
    result = None
    log = []
    for line in (stdout + "\n" + stderr).splitlines():
        if line.startswith(PROBE_MARK):
            result = json.loads(line[len(PROBE_MARK):])
        elif line.strip():
            log.append(line)
    if result is None:
        tail = " | ".join(log[-3:])
        return {"error": f"Trinity's config check exited with {returncode} without a result ({tail})", "error_type": "ProbeCrash", "log": log}
    result["log"] = log
    return result


_VALIDATOR_LOG = re.compile(r"^(WARNING|INFO)\s.*?\[config_validator\.py:\d+\]\s+(.*)$")


def trinity_notes(log: list[str]) -> list[str]:
    """Trinity's validator warnings, in its own words (the long INFO dumps left out)."""
    out = []
    for line in log:
        m = _VALIDATOR_LOG.match(line)
        if m and m.group(1) == "WARNING" and len(m.group(2)) < 300:
            out.append(m.group(2))
    return out


def read_model_config(path: str | None) -> dict:
    if not path:
        return {}
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def max_position_embeddings(model_cfg: dict) -> int | None:
    for holder in (model_cfg, model_cfg.get("text_config") or {}):
        v = holder.get("max_position_embeddings")
        if isinstance(v, int):
            return v
    return None


def fix_for_error(error: str, model_cfg: dict) -> str:
    """A one-sentence fix for an error Trinity raised while validating."""
    if "max_model_len" in error and "Unable to determine" in error:
        mpe = max_position_embeddings(model_cfg)
        if mpe:
            return (f"Set `model.max_model_len` in the config, e.g. `max_model_len: {mpe}` (the model's config.json "
                    f"max_position_embeddings; a smaller value leaves more GPU memory for the KV cache).")
        return "Set `model.max_model_len` in the config (at most the model's max_position_embeddings)."
    if error.startswith("Invalid configuration"):
        return "Fix the key or value Trinity names (a misspelt key or a wrong type), following Trinity's config reference."
    if "No module named" in error or "cannot import trinity" in error:
        return "Install the locked stack (`uv sync --frozen`, or run the flake's `nix run .#serve`)."
    return "Change the setting Trinity names in its message."


_FULL_KEY = re.compile(r"full_key:\s*(\S+)")


def one_line(error: str) -> str:
    """Trinity's (or OmegaConf's) error on one line: its first line, plus the key OmegaConf names
    on a later line (``full_key: a.b``) when the first line does not."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    first = lines[0].rstrip(".")
    key = _FULL_KEY.search(error)
    if key and key.group(1) not in first:
        first += f" (key {key.group(1)})"
    return first


def check_trinity(result: dict, raw: dict, model_cfg: dict, config_path: str) -> list[Finding]:
    out = []
    err = result.get("error")
    err = one_line(err) if err else err
    if err:
        out.append(Finding("config.trinity", FAIL, f"Trinity refuses {config_path}: {err.rstrip('.')}.",
                           fix_for_error(err, model_cfg), {k: result.get(k) for k in ("error", "error_type", "stage")}))
    changes = result.get("changes", {})
    sync = changes.get("synchronizer.sync_method")
    if sync:
        out.append(Finding("config.sync_method", INFO,
                           f"Trinity rewrites synchronizer.sync_method {sync[0]} -> {sync[1]} in {get(raw, 'mode', '?')} mode, so vLLM must accept WeightTransferConfig(backend=\"checkpoint\") (see vllm-api.weight_transfer_backend).",
                           "", {"before": sync[0], "after": sync[1]}))
    oai = changes.get("explorer.rollout_model.enable_openai_api")
    if oai:
        out.append(Finding("config.enable_openai_api", INFO, f"Trinity sets explorer.rollout_model.enable_openai_api {oai[0]} -> {oai[1]} in serve mode.", ""))
    for note in trinity_notes(result.get("log", [])):
        if result.get("tmp_root"):
            note = note.replace(result["tmp_root"], result["real_root"])
        if "NCCL" in note and sync:
            continue  # already said above
        out.append(Finding("config.trinity.note", INFO, f"Trinity: {note}", ""))
    if result.get("assumed"):
        a = result["assumed"]
        out.append(Finding("config.cluster", INFO,
                           f"cluster.node_num / gpu_per_node are not set, so Trinity will ask the running Ray cluster; the doctor checked with {a}.", "", {"assumed": a}))
    if not err:
        out.append(Finding("config.trinity", OK, f"Trinity's load_config + check_and_update accept {config_path} ({len(changes)} values filled in or rewritten).",
                           "", {"changes": changes, "final": result.get("final", {})}))
        job = (result.get("final") or {}).get("checkpoint_job_dir")
        if job and os.path.isdir(job) and os.listdir(job) and get(raw, "continue_from_checkpoint", True) is False:  # Trinity 0.6.0 defaults to True
            out.append(Finding("config.checkpoint_dir", INFO,
                               f"{job} already holds files, so Trinity will run under a new name `<name>_<timestamp>` (continue_from_checkpoint is false; remove it to reuse the directory).", ""))
    return out


def check_file(config_path: str) -> tuple[dict | None, list[Finding]]:
    """The raw YAML and a finding about reading it."""
    try:
        raw = load_yaml(config_path)
    except ConfigFileError as exc:
        return None, [Finding("config.file", FAIL, exc.problem, exc.fix, {"path": str(config_path)})]
    mode = raw.get("mode")
    f = Finding("config.file", OK, f"{config_path} is a YAML mapping (mode: {mode}).", "", {"path": str(config_path), "mode": mode})
    out = [f]
    if mode != "serve":
        out.append(Finding("config.mode", WARN, f"{config_path} has mode: {mode}, not serve; rftstack serves with mode: serve.", "Set `mode: serve`."))
    return raw, out
