"""Shared test code (plain functions and classes; fixtures live in conftest.py): the repository's
paths, running Python and the CLI in a subprocess, and `rftstack serve` as a real child."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON_DIR = REPO / "python"


def trinity_engine_args() -> str:
    """tests/gpu/host_session.sh's TRINITY_ENGINE_ARGS default: the vLLM arguments a bare server is given to run as
    Trinity's engine does (the name of that bare variant in serve_profile.py's results)."""
    import engine_table  # bench/ (pytest's pythonpath): the one reader of host_session.sh's defaults

    return engine_table.host_session_defaults()[0]


def flat(text: str) -> str:
    """``text`` with every run of white space one space: a docs claim reads the same however its lines are wrapped."""
    return " ".join(text.split())


def doc_section(heading: str, doc: Path = REPO / "docs" / "benchmarks.md") -> str:
    """The text of ``doc``'s section under the heading line that starts with ``heading``, up to the next ### heading."""
    import re

    m = re.search(rf"^{re.escape(heading)}[^\n]*\n(.*?)(?=^### )", doc.read_text(), flags=re.S | re.M)
    assert m, f"{doc.relative_to(REPO)} has no '{heading}' section"
    return m.group(1)


def answered_level(run: dict, phase: str, key: str, c: int) -> dict:
    """serve_vs_bare result ``run``'s level at concurrency ``c`` of ``phase``'s load ``key`` (summary_table's reader,
    which refuses a level with errors), asserting that every request of it was answered."""
    import summary_table  # bench/ (pytest's pythonpath)

    lv = summary_table._level(summary_table._phase(run, phase, run["label"]), key, c, run["label"])
    assert lv["ok"] == lv["requests"]
    return lv


def answered_tok_s(run: dict, phase: str, key: str, c: int) -> float:
    """:func:`answered_level`'s output tokens/s."""
    return answered_level(run, phase, key, c)["output_tokens_per_s"]


def named_runs(section: str) -> list[tuple[str, dict]]:
    """The result files a docs section lists as ``- `bench/results/....json`: ...`` lines, in its order, each with its
    JSON: the runs a section's table is computed from (bench/run_spread.py)."""
    import re

    return [(p, json.loads((REPO / p).read_text())) for p in re.findall(r"^- `([^`]+\.json)`: ", section, flags=re.M)]


def numeric_windows(result: Path, c: str) -> list[dict]:
    """bench/serve_profile.py's windows of numeric-fields requests in one result file at level ``c``: the serve's
    engine reached directly first (where the file has a serve), then each bare variant's, in the run's order."""
    r = json.loads(result.read_text())
    out = [r["serve"]["levels"][c]["engine_numeric"]] if "serve" in r else []
    return out + [b["levels"][c]["bare_like_proxy_numeric"] for b in r.get("bare_variants", {}).values()]


# TRINITY_ENGINE_ARGS as sessions V and W ran it (the name of that bare variant in their result files): 256 sequences a
# step, where Trinity's engine has vLLM's scheduler default of 128 (found by tests/bench/test_engine_bisect.py since)
ENGINE_ARGS_SESSIONS_VW = ("--max-num-batched-tokens 2048 --max-num-seqs 256 --logprobs-mode processed_logprobs --seed 42 "
                           "--async-scheduling --distributed-executor-backend mp")


def write_report_config(path: Path, model: Path, *, max_model_len: int | None = 2048) -> Path:
    """The config of the user report (rftstack.run.report_config: mode serve, sync_method nccl, engine_num 1,
    0.60) on ``model``, with max_model_len (None: as the report wrote it) and checkpoints next to ``path``."""
    from rftstack.run import report_config

    return report_config.write(path, model, max_model_len=max_model_len, checkpoint_root_dir=path.parent / "ckpt")


def run_python(code: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment (heavy imports stay out of pytest)."""
    full_env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env,
    )


def run_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `rftstack ARGS` as a user would, in a subprocess."""
    full_env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rftstack", *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )


# ---- rftstack serve / ray-head -------------------------------------------------------------------

ROOT = REPO
FAKE_TRINITY = REPO / "tests" / "doubles" / "fake_trinity.py"


def rftstack_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "FAKE_TRINITY"):
        env.pop(k, None)
    env.update(extra)
    if str(FAKE_TRINITY) in env.get("RFTSTACK_TRINITY_CMD", "") and "RFTSTACK_WARM_WORKERS" not in extra:
        # serve's own head without warm workers for the trinity test double: it starts no actors to use
        # them, and each would import torch, vLLM and Trinity (15-20 s of a 2-core machine); the
        # default (one per actor) is tested in tests/run/test_warm_workers.py
        env["RFTSTACK_WARM_WORKERS"] = "0"
    return env


class ServeRun:
    """`python -m rftstack serve ... --json` (or ``command``, e.g. train) as a real child process."""

    def __init__(self, args: list[str], env: dict, cwd: Path, run_dir: Path, command: str = "serve", prefix: list[str] = ()):
        self.run_dir = run_dir
        # stderr (progress lines) goes to a file: a pipe nobody reads would block a long serve
        self.stderr_path = run_dir.parent / f"{run_dir.name}.stderr"
        self._stderr_file = open(self.stderr_path, "w")
        if os.environ.get("RFTSTACK_TEST_SKIP_DOCTOR") == "1" and "--skip-doctor" not in args:
            args = [*args, "--skip-doctor"]  # named knob: a host whose doctor FAILs for reasons recorded elsewhere
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "rftstack", command, "--json", "--run-dir", str(run_dir), *args],
            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=self._stderr_file, text=True,
        )  # fmt: skip
        self.events: list[dict] = []
        self.stderr = ""

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_event(self, name: str, timeout: float = 300) -> dict | None:
        """Read JSON lines until event ``name`` (None if the process ended first)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                return None
            ev = json.loads(line)
            self.events.append(ev)
            if ev["event"] == name:
                return ev
        raise AssertionError(f"no {name} event within {timeout} s")

    def finish(self, timeout: float = 240) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        for line in out.splitlines():
            self.events.append(json.loads(line))
        self._stderr_file.close()
        self.stderr = self.stderr_text()
        return self.proc.returncode

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def tags(self) -> list[str]:
        try:
            st = self.status()
        except OSError:
            return []
        return [t for t in (st.get("tag"), (st.get("ray") or {}).get("tag")) if t]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def ray_gcs_pid(ray_tag: str) -> int | None:
    """The GCS (`gcs_server`) of the Ray head tagged ``ray_tag``: what the head lives and dies with."""
    from rftstack.run import supervisor

    found = [p.pid for p in supervisor.tagged(ray_tag) if Path(p.cmdline.split(" ")[0]).name == "gcs_server"]
    assert len(found) <= 1, f"more than one gcs_server carries {ray_tag}: {found}"
    return found[0] if found else None


def trinity_driver_pids(serve_tag: str) -> list[int]:
    """The `trinity run --config X` processes of a serve (the driver, not Trinity's ray:: actors)."""
    from rftstack.run import supervisor

    return [p.pid for p in supervisor.tagged(serve_tag) if " run --config " in f" {p.cmdline} " and not p.cmdline.startswith("ray::")]


def experience_reads(db: str | os.PathLike) -> tuple[dict[str, int], dict[int, list[str]] | None]:
    """Per experience its `consumed`; per trainer step the experiences the patched SQL reader
    recorded for it (trinity-sql-read-requeue.patch's side table; None when there is none)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        consumed = dict(con.execute("select msg_id, consumed from experience_buffer").fetchall())
        tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
        if "experience_buffer_reads" not in tables:
            return consumed, None
        steps: dict[int, list[str]] = {}
        for step, msg_id in con.execute("select r.step, e.msg_id from experience_buffer_reads r "
                                         "join experience_buffer e on e.id = r.id order by r.step, e.msg_id"):  # fmt: skip
            steps.setdefault(step, []).append(msg_id)
        return consumed, steps
    finally:
        con.close()


def fill(mnt: Path) -> Path:
    """Write zeros until the file system says ENOSPC; returns the filler file."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with open(filler, "ab", buffering=0) as f:  # the last partial block
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler
