"""tests/gpu/device/step_names.sh, sourced by tests/gpu/host_session.sh (run here in bash, no GPU needed): a step run
again with the same LOGS writes its log, its serve_vs_bare label (so its result JSON and work folder) and its
serve lines as STEP-2, STEP-3, ...; a steps.txt an earlier session ended moves aside, so that watch.sh waits for this
session's "all done". Session AM ran `ready-3b-late` twice and had to move the first run's files aside by hand."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "device" / "step_names.sh"
SESSION = ROOT / "tests" / "gpu" / "host_session.sh"


def sourced(code: str, *args: str) -> list[str]:
    out = subprocess.run(["bash", "-c", f'set -u; . "{SCRIPT}"; {code}', "bash", *args], capture_output=True,
                         text=True, timeout=30, check=True)  # fmt: skip
    return out.stdout.splitlines()


def test_run_name_counts_the_logs_already_there(tmp_path):
    assert sourced('run_name "$1" ready-3b-late', str(tmp_path)) == ["ready-3b-late"]
    (tmp_path / "ready-3b-late.log").write_text("")
    (tmp_path / "ready-3b-late-runs.tgz").write_text("")  # only the log counts
    assert sourced('run_name "$1" ready-3b-late', str(tmp_path)) == ["ready-3b-late-2"]
    (tmp_path / "ready-3b-late-2.log").write_text("")
    assert sourced('run_name "$1" ready-3b-late', str(tmp_path)) == ["ready-3b-late-3"]
    assert sourced('run_name "$1" ready-3b', str(tmp_path)) == ["ready-3b"]  # a prefix is another step


def test_label_args_suffixes_the_label_alone():
    args = ["--model", "/tmp/bench/qwen3b", "--label", "qwen3b-warm-late", "--phases", "bare,trinity",
            "--serve-cmd", "{python} -m rftstack serve -c {config}"]  # fmt: skip
    code = 'label_args "$1" "${@:2}"; printf "%s\\n" "${LABELLED[@]}"'
    assert sourced(code, "-2", *args) == [*args[:3], "qwen3b-warm-late-2", *args[4:]]
    assert sourced(code, "", *args) == args  # the first run: unchanged


def test_rotate_steps_moves_an_ended_session_aside(tmp_path):
    steps = tmp_path / "steps.txt"
    steps.write_text("start rl\nend rl rc=0 92 s\nall done\n")
    sourced('rotate_steps "$1"', str(tmp_path))
    assert not steps.exists() and (tmp_path / "steps-1.txt").read_text().endswith("all done\n")
    steps.write_text("all done\n")
    sourced('rotate_steps "$1"', str(tmp_path))
    assert (tmp_path / "steps-2.txt").exists() and (tmp_path / "steps-1.txt").exists()
    steps.write_text("start rl\n")  # a session still running (or cut short) keeps its file
    sourced('rotate_steps "$1"', str(tmp_path))
    assert steps.read_text() == "start rl\n" and not (tmp_path / "steps-3.txt").exists()
    sourced('rotate_steps "$1"', str(tmp_path / "none"))  # no steps.txt: nothing to do, no error


def test_host_session_names_each_run_so():
    text = SESSION.read_text()
    head, loop = text.split('for step in "${steps[@]}"; do', 1)
    assert ". tests/gpu/device/step_names.sh" in head and 'rotate_steps "$LOGS"' in head
    assert head.index('rotate_steps "$LOGS"') < head.index("note()")  # before the first line of this session
    assert 'label_args "$suffix" "$@"' in head and '"${LABELLED[@]}"' in head.split("bench() {")[1].split("\n")[0]
    assert 'run=$(run_name "$LOGS" "$step"); suffix=${run#"$step"}' in loop
    assert 'esac > "$LOGS/$run.log" 2>&1' in loop and 'note "end $run rc=$?' in loop
    assert 'tar czf "$LOGS/$run-runs.tgz"' in loop


def test_host_session_runs_a_step_twice_and_again(tmp_path):
    """host_session.sh itself, its python3 a TEST DOUBLE that records its arguments and succeeds (the steps need a GPU):
    `ready-3b-late` twice in one session, then once in a second session with the same LOGS."""
    import os

    bin_, logs, calls = tmp_path / "bin", tmp_path / "gs", tmp_path / "calls.txt"
    bin_.mkdir()
    (bin_ / "python3").write_text(f'#!/bin/bash\necho "python3 $*" >> {calls}\nexit 0\n')
    (bin_ / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LOGS": str(logs)}
    for steps in (["ready-3b-late", "ready-3b-late"], ["ready-3b-late"]):
        subprocess.run(["bash", str(SESSION), *steps], env=env, capture_output=True, timeout=120, check=True)
    labels = [ln.split("--label ")[1].split()[0] for ln in calls.read_text().splitlines() if "serve_vs_bare.py" in ln]
    assert labels == ["qwen3b-warm-late", "qwen3b-warm-late-2", "qwen3b-warm-late-3"]
    for name in ("ready-3b-late", "ready-3b-late-2", "ready-3b-late-3"):
        for suffix in (".log", "-runs.tgz", "-serve-lines.txt"):
            assert (logs / f"{name}{suffix}").exists(), name + suffix
    first, second = (logs / "steps-1.txt").read_text(), (logs / "steps.txt").read_text()
    assert "end ready-3b-late rc=0" in first and "end ready-3b-late-2 rc=0" in first and first.endswith("all done\n")
    assert "start ready-3b-late-3" in second and second.count("all done") == 1
