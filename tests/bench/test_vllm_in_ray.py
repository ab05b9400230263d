"""bench/vllm_in_ray.py (`vllm serve` inside one plain Ray actor) and serve_profile.py's ``@ray-actor`` word.

Real: a local Ray node started by the script, its async actor, vLLM's own start-method decision in it
(``is_in_ray_actor``, ``_maybe_force_spawn``), vLLM's own `vllm serve` parser failing on this machine as bare
`vllm serve` does (no GPU, so no device type), and the processes left afterwards, read from ``ps``. No GPU here: the
server itself runs on the GPU host (tests/gpu/host_session.sh).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import serve_profile as sp
import vllm_in_ray as vir
from rftstack.doctor.netstat import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "vllm_in_ray.py"
NO_GPU = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="on a GPU machine this would really serve")


def script_env() -> dict[str, str]:
    """This environment, less what would steer Ray elsewhere (an address, a worker niceness)."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}


def in_session(sid: int) -> list[tuple[int, str, str]]:
    """(pid, niceness, command line) of every live process of process session ``sid``, zombies left out."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,stat=,ni=,args="], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        pid, s, stat, ni, args = (line.split(None, 4) + [""])[:5]
        if int(s) == sid and not stat.startswith("Z"):
            rows.append((int(pid), ni, args))
    return rows


def with_args(pattern: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if pattern in line]


def alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0].startswith("Z")
    except (OSError, IndexError):
        return False


def session_dir(stdout: str) -> str:
    m = re.search(r"^vllm_in_ray: Ray node started, session (\S+)$", stdout, re.M)
    assert m, stdout[-3000:]
    return m.group(1)


@pytest.mark.slow
@NO_GPU
def test_in_a_ray_actor_vllm_spawns_its_engine_core_and_a_failed_server_is_one_line(tiny_model):
    """The fact the GPU step relies on: inside the script's actor vLLM sees a Ray actor and will spawn its
    EngineCore. Here vLLM's own `vllm serve` parser then fails (no device type without a GPU), which the driver
    says in one line, exit 1, with its Ray node and actor gone."""
    # its own process session (as serve_profile.py starts it), so that everything it started is found by it
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(tiny_model), "--ray-num-gpus", "0",
                             "--host", "127.0.0.1", "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=script_env(), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = stdout[-4000:] + stderr[-4000:]
    assert proc.returncode == 1, said
    session = session_dir(stdout)
    assert (Path(session) / "logs").is_dir(), "a real Ray node of its own, with its session directory"
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("VLLM_IN_RAY ")]
    fields = dict(w.split("=", 1) for w in line.split()[1:])
    assert fields["in_ray_actor"] == "True" and fields["multiproc_method"] == "spawn", line
    # Ray's worker: its default niceness, vLLM's server on the async actor's loop in a thread of Ray's
    assert fields["niceness"] == "15" and fields["main_thread"] == "False", line
    assert fields["pid"] != str(proc.pid)
    # what Ray set in the actor's environment, which its EngineCore would inherit
    assert fields["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1"), line
    mine = [ln for ln in stderr.splitlines() if ln.startswith("vllm_in_ray:")]
    assert len(mine) == 1 and mine[0].startswith("vllm_in_ray: vLLM's server failed inside the Ray actor: RuntimeError: "), said
    assert "Failed to infer device type" in mine[0]
    # the traceback is the actor's own, before the one line
    assert "(VllmServeActor pid=" in stderr and "Traceback (most recent call last)" in stderr
    # nothing left: no process of its session (raylet, gcs_server, the actor), none naming its node's session
    assert in_session(proc.pid) == [] and with_args(session) == [] and not alive(int(fields["pid"]))


@pytest.mark.slow
@NO_GPU
def test_sigterm_stops_the_actor_and_the_node_and_exits_0(tiny_model):
    """SIGTERM while the actor starts: the node's processes and the actor (at the niceness asked for) existed, and
    after exit 0 none is left."""
    p = subprocess.Popen([sys.executable, str(SCRIPT), str(tiny_model), "--ray-num-gpus", "0", "--worker-niceness", "7",
                          "--port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=script_env(), start_new_session=True)
    try:
        lines: list[str] = []
        assert p.stdout is not None
        for ln in p.stdout:
            lines.append(ln)
            if "Ray node started" in ln:
                break
        session = session_dir("".join(lines))
        deadline = time.monotonic() + 120
        while not (actors := [r for r in in_session(p.pid) if r[2].startswith(vir.ACTOR_TITLE)]):
            assert time.monotonic() < deadline and p.poll() is None, "".join(lines)
            time.sleep(0.2)
        running = in_session(p.pid)
        assert any("raylet" in args and session in args for _, _, args in running), (session, running)
        assert any("gcs_server" in args and session in args for _, _, args in running)
        assert actors[0][1] == "7", actors
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = "".join(lines) + out
    assert p.returncode == 0, text[-4000:]
    assert "vllm_in_ray: SIGTERM: stopping the actor and the Ray node" in text
    assert "failed inside the Ray actor" not in text
    assert in_session(p.pid) == [] and with_args(session) == [] and not alive(actors[0][0])


def test_its_own_options_are_taken_out_and_vllms_left_in_order():
    own, rest = vir.parse_own(["/m", "--port", "8000", "--ray-num-gpus", "0", "--seed", "42", "--worker-niceness", "0",
                               "--override-generation-config", '{"max_new_tokens": 8}'])
    assert (own.ray_num_gpus, own.worker_niceness) == (0.0, 0)
    assert rest == ["/m", "--port", "8000", "--seed", "42", "--override-generation-config", '{"max_new_tokens": 8}']
    own, rest = vir.parse_own(["/m"])
    assert (own.ray_num_gpus, own.worker_niceness, rest) == (1.0, None, ["/m"])


def test_its_own_options_are_never_abbreviated():
    """An abbreviation of its own option is not taken for it: it goes to vLLM's parser, as any word it does not know."""
    assert vir.parse_own(["/m", "--ray-num-gpu", "0"])[1] == ["/m", "--ray-num-gpu", "0"]


@pytest.mark.parametrize("argv", [[], ["--port", "8000"], ["/m", "--ray-num-gpus", "-1"]])
def test_bad_command_lines_stop_before_ray(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vir.parse_own(argv)
    assert exc.value.code == 2 and "vllm_in_ray.py: error:" in capsys.readouterr().err


def test_a_failure_is_the_actors_own_exception_in_one_line():
    from ray.exceptions import RayTaskError

    assert vir.failure_line(RuntimeError("Failed to infer device type\nmore")) == "RuntimeError: Failed to infer device type"
    wrapped = RayTaskError("serve", "Traceback ...\nRuntimeError: boom", RuntimeError("boom"))
    assert vir.failure_line(wrapped) == "RuntimeError: boom"


def test_stop_processes_ends_what_the_actor_started(tmp_path):
    """The driver's last step for the actor's children (vLLM's EngineCore and its workers): real processes, one
    that ignores SIGTERM, all gone after it."""
    code = ("import signal, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(1, flush=True); time.sleep(60)'], stdout=subprocess.PIPE)\n"
            "c.stdout.readline(); print('ready', flush=True); time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        below = vir.descendants(parent.pid)
        assert len(below) == 1 and vir.descendants(None) == []
        t0 = time.monotonic()
        vir.stop_processes(below, grace_s=1.0)
        assert not alive(below[0].pid) and time.monotonic() - t0 < 10
    finally:
        parent.kill()
        parent.wait()


# ---- serve_profile.py's @ray-actor word ----------------------------------------------------------------------------


def argv_of(variant: str) -> tuple[str, list[str], dict[str, str]]:
    return sp.bare_argv("/models/qwen3b", 8123, 0.6, 2048, sp.bare_args(variant))


def test_a_variant_without_the_word_is_todays_vllm_serve():
    for variant, words in (("", []), ("default", []), ("--seed 42 --max-num-seqs 256", ["--seed", "42", "--max-num-seqs", "256"])):
        launcher, argv, env = argv_of(variant)
        assert launcher == "vllm-serve" and env == {}
        assert argv == ["vllm", "serve", "/models/qwen3b", "--host", "127.0.0.1", "--port", "8123",
                        "--gpu-memory-utilization", "0.6", "--max-model-len", "2048", *words]
    assert argv_of("VLLM_USE_RUST_FRONTEND=1 --seed 42")[1:] == (
        ["vllm", "serve", "/models/qwen3b", "--host", "127.0.0.1", "--port", "8123", "--gpu-memory-utilization", "0.6",
         "--max-model-len", "2048", "--seed", "42"], {"VLLM_USE_RUST_FRONTEND": "1"})


@pytest.mark.parametrize("variant", ["@ray-actor --seed 42", "--seed 42 @ray-actor", "VLLM_X=1 --seed @ray-actor 42"])
def test_the_word_runs_the_same_arguments_through_vllm_in_ray(variant):
    launcher, argv, env = argv_of(variant)
    _, serve_argv, serve_env = argv_of(variant.replace("@ray-actor", ""))
    assert launcher == "ray-actor" and "@ray-actor" not in argv
    assert argv[:2] == [sys.executable, str(SCRIPT)] and SCRIPT.is_file()
    assert argv[2:] == serve_argv[2:] and env == serve_env
    # the script hands vLLM's parser exactly what `vllm serve` would get after its word `serve`
    own, rest = vir.parse_own(argv[2:])
    assert rest == serve_argv[2:] and (own.ray_num_gpus, own.worker_niceness) == (1.0, None)


def test_the_scripts_own_niceness_rides_along_as_a_variant_word():
    _, argv, _ = argv_of("@ray-actor --worker-niceness 0 --seed 42")
    own, rest = vir.parse_own(argv[2:])
    assert own.worker_niceness == 0 and rest == argv_of("--seed 42")[1][2:]


def test_the_word_keeps_its_variant_apart_in_the_result_and_its_log():
    assert sp.variant_names(sp.bare_args("@ray-actor")) == ("@ray-actor", "ray-actor")
    assert sp.variant_names(sp.bare_args("@ray-actor --seed 42")) == ("@ray-actor --seed 42", "ray-actor-seed-42")
    assert sp.variant_names(sp.bare_args("@ray-actor"), 2) == ("@ray-actor #2", "ray-actor-r2")
    # beside the same arguments without it: another key, another log
    assert sp.variant_names(sp.bare_args("--seed 42")) == ("--seed 42", "seed-42")
    assert sp.variant_names(sp.bare_args("default")) == (None, "")


def test_its_profile_samples_the_actor_in_place_of_vllm_serve():
    assert sp.RAY_ACTOR_TARGETS[0] == vir.ACTOR_TITLE == "ray::VllmServeActor"
    assert sp.RAY_ACTOR_TARGETS[1:] == sp.BARE_TARGETS[1:] and sp.BARE_TARGETS[0] == "*vllm serve"


def test_the_bare_variants_help_names_the_word(capsys):
    with pytest.raises(SystemExit):
        sp.main(["--help"])
    assert "@ray-actor" in capsys.readouterr().out and "@ray-actor" in (sp.__doc__ or "")
