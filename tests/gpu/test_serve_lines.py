"""tests/gpu/device/serve_lines.sh, run here (no GPU needed): after each step host_session.sh writes the serve logs'
lines that name the proxy's builders or recorders and `All models are ready.` to LOGS/STEP-serve-lines.txt, a file
tests/gpu/device/watch.sh brings back. Session AL could not show in which order its builders and its models became
ready: the run directories stay on the host. The logs here are files in tmp_path laid out as on the host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "device" / "serve_lines.sh"

BUILDERS = ("(Explorer pid=8995) INFO 12-06 18:47:31 [recorder.py:644] Experience builders: 4 processes "
            "(RFTSTACK_PROXY_BUILD_PROCESSES unset: auto, rftstack patch), pids 9910 9911 9912 9913")
READY = "(Explorer pid=8995) INFO 12-06 18:47:35 [explorer.py:160] All models are ready."
BUILDER_READY = "(Explorer pid=8995) INFO 12-06 18:47:34 [recorder.py:230] Experience builder 9910 ready"
RECORDERS = "(Explorer pid=7) INFO 12-06 18:47:31 [recorder.py:644] Experience recorders: 2 processes"
OTHER = "(Explorer pid=8995) INFO 12-06 18:47:36 [service.py:80] Starting the proxy"


def write(path: Path, *lines: str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(ln + "\n" for ln in lines))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def run(logs: Path, step: str, t0: int, pt_root: Path, *name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PT_ROOT": str(pt_root)}
    return subprocess.run(["bash", str(SCRIPT), str(logs), step, str(t0), *name], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


def test_the_steps_serve_lines_in_order_with_their_files(tmp_path):
    logs, pt = tmp_path / "gs", tmp_path / "pt"
    t0 = int(time.time()) - 5
    bench = write(logs / "bench" / "work" / "qwen3b-abba1" / "trinity-run" / "logs" / "trinity.log",
                  BUILDERS, BUILDER_READY, OTHER, READY)  # fmt: skip
    pytest_log = write(pt / "pt-rl" / "rl0" / "run" / "logs" / "trinity.log", RECORDERS, READY)
    old = write(logs / "bench" / "work" / "earlier" / "trinity-run" / "logs" / "trinity.log", BUILDERS,
                mtime=t0 - 3600)  # an earlier step's serve: not this step's
    other_step = write(pt / "pt-java" / "java0" / "run" / "logs" / "trinity.log", READY)
    out = run(logs, "rl", t0, pt)
    assert out.returncode == 0, out.stderr
    lines = (logs / "rl-serve-lines.txt").read_text().splitlines()
    assert f"{bench}:{BUILDERS}" in lines and f"{bench}:{BUILDER_READY}" in lines and f"{bench}:{READY}" in lines
    assert f"{pytest_log}:{RECORDERS}" in lines and f"{pytest_log}:{READY}" in lines
    assert not any(OTHER in ln or str(old) in ln or str(other_step) in ln for ln in lines), lines
    mine = [ln for ln in lines if ln.startswith(f"{bench}:")]  # one file's lines keep their order
    assert mine == [f"{bench}:{ln}" for ln in (BUILDERS, BUILDER_READY, READY)]


def test_a_step_without_serve_logs_leaves_an_empty_file_and_succeeds(tmp_path):
    logs = tmp_path / "gs"
    logs.mkdir()
    out = run(logs, "bad", int(time.time()), tmp_path / "pt")
    assert out.returncode == 0 and (logs / "bad-serve-lines.txt").read_text() == ""


def test_host_session_writes_them_after_each_step():
    session = (ROOT / "tests" / "gpu" / "host_session.sh").read_text()
    loop = session[session.index('for step in "${steps[@]}"; do'):session.index('note "all done"')]
    assert 'bash tests/gpu/device/serve_lines.sh "$LOGS" "$step" "$t0" "$run"' in loop.split("esac")[-1]


def test_watch_brings_the_serve_lines_back_and_prints_each_steps_levels(tmp_path):
    """watch.sh itself, on a LOGS laid out as on the host (GS): its archive holds the serve lines, the step logs and
    the results; it prints serve_profile.py's window lines (`resp/s`, which session AN's first polls left out) and
    the load generator's and interleave.py's beside the steps. No nvidia-smi here: its line is left out, the exit stays 0."""
    import tarfile

    gs, out = tmp_path / "gs", tmp_path / "out"
    out.mkdir()
    write(gs / "steps.txt", "2026-12-07T10:05:16Z end engine3b-profile rc=0 337 s", "2026-12-07T10:05:16Z all done")
    write(gs / "engine3b-profile.log", "[serve_profile 10:00:43] c=32 proxy: 102.71 resp/s, p50 0.3106 s", "noise")
    write(gs / "proxy3b-abba.log", "[serve_vs_bare x] [loadgen bare] c=64: 2048/2048 ok, 12764.04 tok/s")
    write(gs / "interleave3b.log", "[interleave 14:01:02] round 2 c=64 spread trinity: 9876.5 tok/s, p99 0.5 s")
    write(gs / "rl-serve-lines.txt", READY)
    write(gs / "bench" / "serve-x.json", "{}")
    write(tmp_path / "install.log", "installed")
    r = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "device" / "watch.sh"), "5"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "GS": str(gs), "OUT": str(out)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "all done" in r.stdout and "c=32 proxy: 102.71 resp/s" in r.stdout and "12764.04 tok/s" in r.stdout
    assert "round 2 c=64 spread trinity: 9876.5 tok/s" in r.stdout  # bench/interleave.py's levels
    assert "noise" not in r.stdout
    with tarfile.open(out / "gs.tgz") as tar:
        names = set(tar.getnames())
    assert {"gs/rl-serve-lines.txt", "gs/engine3b-profile.log", "gs/bench/serve-x.json", "install.log"} <= names


def test_a_second_run_of_a_step_writes_its_own_file(tmp_path):
    """NAME (host_session.sh's STEP-2 for a step's second run with the same LOGS): the lines go to NAME's file, the
    first run's file stays as it was."""
    logs, pt = tmp_path / "gs", tmp_path / "pt"
    first = write(logs / "rl-serve-lines.txt", "the first run's lines")
    t0 = int(time.time()) - 5
    log = write(pt / "pt-rl" / "rl0" / "run" / "logs" / "trinity.log", READY)
    out = run(logs, "rl", t0, pt, "rl-2")
    assert out.returncode == 0, out.stderr
    assert (logs / "rl-2-serve-lines.txt").read_text().splitlines() == [f"{log}:{READY}"]
    assert first.read_text() == "the first run's lines\n"
