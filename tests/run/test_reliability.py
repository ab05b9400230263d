"""Bad input to `rftstack serve`, each with its exact message, exit code, and nothing left running.

The cases already covered elsewhere (doctor's model, GPU, driver, port and Ray findings; serve's
missing config and wrong mode) are listed in docs/reliability.md with their tests; this file adds
the ones that had no exact-message test. Every CLI case runs the real `python -m rftstack serve`
and stops before Ray or Trinity would start, so "nothing left running" is checked by the tags.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import rftstack_env
from rftstack.run import serve_config
from rftstack.errors import UserError

BOGUS_RAY = ["--skip-doctor", "--port", "0", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent"]


def serve_cli(tmp_path: Path, *args: str, run_dir: Path | None = None) -> subprocess.CompletedProcess:
    run_dir = run_dir or tmp_path / "run"
    env = rftstack_env(XDG_CACHE_HOME=str(tmp_path / "cache"), RFTSTACK_TRINITY_CMD="/bin/false")
    return subprocess.run([sys.executable, "-m", "rftstack", "serve", "--run-dir", str(run_dir), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip


def config(tmp_path: Path, text: str) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return str(p)


def model_dir(tmp_path: Path, max_pos: int = 32768) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(f'{{"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": {max_pos}}}')
    return d


CLI_CASES = {
    "malformed_yaml": (
        "mode: serve\nmodel: [unclosed\n",
        "the config {cfg} is not valid YAML (while parsing a flow sequence); fix the file",
    ),
    "not_a_mapping": ("- a\n- b\n", "the config file is not a YAML mapping; write it as `key: value` lines (see docs/serve.md)"),
    "no_model_path": ("mode: serve\nmodel: {}\n", "the config has no model.model_path; set it to a local model directory"),
    "gmu_above_1": (
        "mode: serve\nmodel: {model_path: /m}\nexplorer: {rollout_model: {gpu_memory_utilization: 1.5}}\n",
        "explorer.rollout_model.gpu_memory_utilization is 1.5, but it is the fraction of each GPU's memory vLLM may use; "
        "set a number above 0 and at most 1 (e.g. 0.6)",
    ),
    "gmu_zero": (
        "mode: serve\nmodel: {model_path: /m}\nexplorer: {rollout_model: {gpu_memory_utilization: 0}}\n",
        "explorer.rollout_model.gpu_memory_utilization is 0, but it is the fraction of each GPU's memory vLLM may use; "
        "set a number above 0 and at most 1 (e.g. 0.6)",
    ),
    "gmu_string": (
        "mode: serve\nmodel: {model_path: /m}\nexplorer: {rollout_model: {gpu_memory_utilization: '60%'}}\n",
        "explorer.rollout_model.gpu_memory_utilization is '60%', but it is the fraction of each GPU's memory vLLM may use; "
        "set a number above 0 and at most 1 (e.g. 0.6)",
    ),
    "max_model_len_negative": (
        "mode: serve\nmodel: {model_path: /m, max_model_len: -1}\n",
        "model.max_model_len is -1; set a positive number of tokens (e.g. 4096) or remove it to use the model's own",
    ),
    "max_model_len_too_large": (
        "mode: serve\nmodel: {model_path: {model}, max_model_len: 65536}\n",
        "model.max_model_len 65536 is larger than the model's max_position_embeddings 32768, which vLLM refuses; set it to at most 32768",
    ),
    "wrong_mode_explore": (
        "mode: explore\nmodel: {model_path: /m}\n",
        "the config's mode is 'explore', rftstack serve runs mode: serve; set `mode: serve` or use `trinity run`",
    ),
    "unmarked_checkpoint": (
        "mode: serve\ncheckpoint_root_dir: {ckpt}\nproject: p\nname: n\nmodel: {model_path: /m}\n",
        "{job}/global_step_4 has no .full_checkpoint marker, and Trinity's synchronizer deletes such a directory after it "
        "loads a newer step; move it out of {job} or mark it to keep (touch {job}/global_step_4/.full_checkpoint)",
    ),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_serve_bad_config(tmp_path, case):
    text, expect = CLI_CASES[case]
    model = model_dir(tmp_path)
    ckpt = tmp_path / "ckpt"
    job = ckpt / "p" / "n"
    (job / "global_step_4").mkdir(parents=True)
    cfg = config(tmp_path, text.replace("{model}", str(model)).replace("{ckpt}", str(ckpt)))
    out = serve_cli(tmp_path, *BOGUS_RAY, "-c", cfg)
    assert out.returncode == 2, out.stderr
    msg = expect.format(cfg=cfg, job=job)
    assert f"error: {msg}\n" in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert (job / "global_step_4").is_dir()  # nothing deleted
    assert not (tmp_path / "run" / "ray").exists() and not (tmp_path / "run" / "logs" / "trinity.log").exists()


def test_serve_unwritable_run_dir(tmp_path):
    """/proc refuses new directories even for root (a chmod'ed directory would not stop root)."""
    target = Path("/proc/rftstack-run")
    out = serve_cli(tmp_path, *BOGUS_RAY, run_dir=target)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(f"rftstack serve: cannot create the run directory {target} (")
    assert out.stderr.strip().endswith("); pass a writable --run-dir or --runs-base")
    assert "Traceback" not in out.stderr


def test_serve_run_dir_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    out = serve_cli(tmp_path, *BOGUS_RAY, run_dir=f / "run")
    assert out.returncode == 2
    assert out.stderr.strip() == f"rftstack serve: cannot create the run directory {f / 'run'} (Not a directory); pass a writable --run-dir or --runs-base"


def test_serve_ray_address_without_token(tmp_path):
    cfg = config(tmp_path, "mode: serve\nmodel: {model_path: /m}\n")
    out = serve_cli(tmp_path, "--skip-doctor", "--port", "0", "--ray-address", "127.0.0.1:1", "-c", cfg)
    assert out.returncode == 2
    assert "error: --ray-address needs the head's token file; pass --ray-token-path or set RAY_AUTH_TOKEN_PATH\n" in out.stdout


def test_explicit_port_in_use(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = config(tmp_path, "mode: serve\nmodel: {model_path: /m}\n")
        out = serve_cli(tmp_path, "--skip-doctor", "--port", str(port), "-c", cfg)
    assert out.returncode == 2
    assert f"error: port {port} (--port) is already in use on this machine; stop what listens there or pass --port 0\n" in out.stdout


def test_expose_prints_who_can_reach_it():
    cfg, _ = serve_config.effective({"mode": "serve", "model": {"model_path": "/m"}}, run_dir="/r", ray_address="a", proxy_port=8123, expose=True)
    assert serve_config.warnings(cfg, expose=True)[-1] == (
        "--expose: the proxy listens on 0.0.0.0:8123; anyone who can reach this machine on that port can "
        "generate with the model and write training data (/feedback, /commit) if it has the API key"
    )
    cfg, changes = serve_config.effective({"mode": "serve", "model": {"model_path": "/m"}, "explorer": {"listen_address": "0.0.0.0"}},
                                          run_dir="/r", ray_address="a", proxy_port=8123)  # fmt: skip
    assert cfg["explorer"]["listen_address"] == "127.0.0.1"
    assert {c.key: c.why for c in changes}["explorer.listen_address"] == "the config asks for 0.0.0.0, but nothing listens outside loopback without --expose"


def test_pure_validation_messages_are_one_sentence():
    for bad in (1.01, -0.2, True, "0.6"):
        with pytest.raises(UserError) as exc:
            serve_config.effective({"model": {"model_path": "/m"}, "explorer": {"rollout_model": {"gpu_memory_utilization": bad}}},
                                   run_dir="/r", ray_address="a", proxy_port=1)  # fmt: skip
        assert "\n" not in str(exc.value) and "set a number above 0 and at most 1" in str(exc.value)
    assert serve_config.effective({"model": {"model_path": "/m"}, "explorer": {"rollout_model": {"gpu_memory_utilization": 1}}},
                                  run_dir="/r", ray_address="a", proxy_port=1)[0]  # fmt: skip


@pytest.mark.slow
def test_ray_token_appears_in_no_log_or_state_file(tmp_path):
    """A real loopback head with a connected driver: the token's value is only in its 0600 token file."""
    import os

    from rftstack.run import ray_head

    head = ray_head.start(state_dir=tmp_path / "head", num_gpus=0, num_cpus=1)
    try:
        drv = subprocess.run([sys.executable, "-c", "import ray; ray.init(address='auto', log_to_driver=False); print(ray.cluster_resources()); ray.shutdown()"],
                             capture_output=True, text=True, timeout=120, env={**rftstack_env(), **head.env()})  # fmt: skip
        assert drv.returncode == 0, drv.stderr[-2000:]
        token = Path(head.token_path).read_text().strip()
        assert len(token) >= 32
        assert os.stat(head.token_path).st_mode & 0o077 == 0
        leaks, scanned = [], 0
        for root in (tmp_path / "head", Path(head.temp_dir)):
            for p in root.rglob("*"):
                if p.is_file() and not p.is_symlink() and str(p) != head.token_path:
                    scanned += 1
                    try:
                        if token.encode() in p.read_bytes():
                            leaks.append(str(p))
                    except OSError:
                        pass
                if token in p.name:
                    leaks.append(f"name {p}")
        assert scanned > 10 and leaks == []
        assert token not in drv.stdout + drv.stderr
    finally:
        ray_head.stop(head, timeout=5, remove_temp=True)
