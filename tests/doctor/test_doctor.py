"""rftstack doctor end to end, on real inputs: the tiny model directory, the report's config file
(with and without max_model_len) validated by the real Trinity in a subprocess, real listening
sockets, the real installed stack. The NVIDIA driver is the one test double (`driver_570` /
`driver_580` below: what NVML says on the report's server, and on the GPU test host)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rftstack
from rftstack.doctor import collect as doctor
from rftstack.doctor import netstat
from rftstack.run import report_config
from rftstack.run import tinymodel
from rftstack.doctor.checks import config as config_check
from rftstack.doctor.checks import gpu, model, network, rlloop, vllm_api
from rftstack.doctor.checks import ray_cluster as ray
from rftstack.findings import FAIL, INFO, OK, WARN
from rftstack.doctor.netstat import free_port

PKG_PARENT = str(Path(rftstack.__file__).resolve().parent.parent)
RTX_5880 = gpu.Gpu("NVIDIA RTX 5880 Ada Generation", (8, 9), 49140, 48610)


def driver_570():
    """Test double for NVML on the report's server: driver 570.133.20, one RTX 5880 Ada (49140 MiB)."""
    return gpu.GpuInfo("570.133.20", (12, 8), (RTX_5880,), "test double: report server (NVML)")


def driver_580():
    """Test double for NVML on a driver-580 host with the same GPU."""
    return gpu.GpuInfo("580.65.06", (13, 0), (RTX_5880,), "test double: driver 580 (NVML)")


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The session's tiny Qwen2 model directory (tests/conftest.py)."""
    return tiny_model


def write_config(tmp_path, model_dir, max_model_len=None, name="report.yaml"):
    """The report's config as the report wrote it (no project/name; max_model_len only if given)."""
    return report_config.write(tmp_path / name, model_dir, max_model_len=max_model_len, project=None, name=None,
                               checkpoint_root_dir=tmp_path / "ckpt")


def by_check(found):
    return {f.check: f for f in found}


# ------------------------------------------------------------------ config file

def test_missing_and_malformed_config_are_one_sentence(tmp_path):
    raw, [f] = config_check.check_file(str(tmp_path / "nope.yaml"))
    assert raw is None and f.status == FAIL and f.message.endswith("does not exist.") and "-c" in f.fix
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: serve\nmodel:\n  model_path: /x\n   max_model_len: 3\n")
    raw, [f] = config_check.check_file(str(bad))
    assert f.status == FAIL and "not valid YAML at line 4" in f.message and "\n" not in f.message
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    assert config_check.check_file(str(lst))[1][0].status == FAIL
    raw, [f] = config_check.check_file(str(tmp_path))
    assert f.status == FAIL and "directory" in f.message


# ------------------------------------------------------------------ Trinity's own validation (subprocess)

@pytest.fixture(scope="module")
def probes(tiny, tmp_path_factory):
    """Trinity's load_config + check_and_update (two real subprocesses side by side, each imports
    torch/ray/verl): the report's config with max_model_len added, and the same without cluster
    sizes (Trinity would ray.init() to count GPUs; the probe must not). The report's config as
    written (no max_model_len) goes through `doctor.collect` below."""
    d = tmp_path_factory.mktemp("cfg")
    nocluster = report_config.config(tiny, max_model_len=2048, project=None, name=None, checkpoint_root_dir=d / "ckpt")
    nocluster["cluster"] = {"node_num": 0}
    paths = {"with": write_config(d, tiny, 2048, name="with.yaml"), "nocluster": d / "nocluster.yaml"}
    paths["nocluster"].write_text(yaml.safe_dump(nocluster, sort_keys=False))
    procs = {k: config_check.Probe(str(p), 1, cwd=d) for k, p in paths.items()}  # started now, read below
    out = {}
    try:
        for k, probe in procs.items():
            res = probe.result()
            assert "error_type" not in res or res["error_type"] not in ("Timeout", "ProbeCrash"), res
            out[k] = (paths[k], res)
    finally:
        for probe in procs.values():
            probe.cancel()
    return d, out


def test_report_config_with_max_model_len_passes_and_nccl_becomes_checkpoint(probes, tiny):
    d, out = probes
    path, res = out["with"]
    raw = config_check.load_yaml(path)
    found = config_check.check_trinity(res, raw, config_check.read_model_config(str(tiny)), str(path))
    fb = by_check(found)
    assert fb["config.trinity"].status == OK
    assert fb["config.sync_method"].status == INFO and "nccl -> checkpoint" in fb["config.sync_method"].message
    assert res["final"]["synchronizer.sync_method"] == "checkpoint"
    # nothing left behind: Trinity's job dirs went to a temporary root, mapped back in the report
    assert not (d / "ckpt").exists() and not Path(res["tmp_root"]).exists()
    assert res["final"]["checkpoint_job_dir"].startswith(str(d / "ckpt"))
    assert all(res["tmp_root"] not in f.message for f in found)


def test_probe_does_not_start_ray_without_cluster_sizes(probes):
    _, out = probes
    _, res = out["nocluster"]
    assert res["error"] is None and res["assumed"] == {"cluster.node_num": 1, "cluster.gpu_per_node": 1}
    assert not any("Started a local Ray instance" in l or "ray.init" in l for l in res["log"])


def test_trinity_error_fixes():
    fix = config_check.fix_for_error("Unable to determine `max_model_len`, please set it manually.", {"max_position_embeddings": 32768})
    assert "max_model_len: 32768" in fix
    assert "max_model_len" in config_check.fix_for_error("Unable to determine `max_model_len`, please set it manually.", {})


# ------------------------------------------------------------------ rl-loop

def test_sync_gate_is_in_installed_trinity():
    src = (vllm_api.package_dir("trinity") / rlloop.SERVICE).read_text()
    line = rlloop.sync_gate(src)
    assert line is not None
    assert "len(self.running_model_ids)" in src.splitlines()[line - 1]
    assert "min_running_model_num" in "\n".join(src.splitlines()[line - 1 : line + 2])


@pytest.mark.parametrize("engines,min_run,is_set,status", [(1, 1, False, WARN), (1, 1, True, WARN), (1, 0, True, OK), (2, 1, False, OK)])
def test_rl_loop(engines, min_run, is_set, status):
    [f] = rlloop.check(engines, min_run, is_set, 68)
    assert f.status == status
    if status == WARN:
        assert "min_running_model_num: 0" in f.fix and "model_weights_sync_loop" in f.message
        assert ("keeps your value" in f.fix) == is_set


# ------------------------------------------------------------------ model directory

@pytest.fixture(scope="module")
def registry():
    return (vllm_api.package_dir("vllm") / model.REGISTRY).read_text()


def test_tiny_model_is_fine_on_the_report_gpu(tiny, registry):
    found = by_check(model.check(str(tiny), registry_source=registry, gpu=driver_570(), gpu_memory_utilization=0.6))
    assert all(f.status == OK for f in found.values()), found
    assert found["model.memory"].data["budget_mib"] == round(49140 * 0.6)


def test_model_problems(tmp_path, tiny, registry):
    import shutil
    d = tmp_path / "m"
    shutil.copytree(tiny, d)
    (d / "chat_template.jinja").unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["NoSuchForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    found = by_check(model.check(str(d), registry_source=registry, gpu=driver_570(), max_model_len=4096))
    assert found["model.chat_template"].status == FAIL
    assert found["model.architecture"].status == WARN
    assert found["model.max_model_len"].status == FAIL and "2048" in found["model.max_model_len"].fix
    for w in d.glob("*.safetensors"):
        w.unlink()
    assert by_check(model.check(str(d), registry_source=registry))["model.weights"].status == FAIL
    assert model.check(str(tmp_path / "missing"), registry_source=registry)[0].status == FAIL


def test_weights_against_gpu_memory(tiny, registry):
    size_mib = sum(p.stat().st_size for p in tiny.glob("*.safetensors")) / 2**20
    one_mib = gpu.GpuInfo("570.133.20", (12, 8), (gpu.Gpu("1 MiB GPU", (8, 9), 1, 1),), "test double")
    gmu = size_mib / 2  # leaves half the tiny model's size
    f = by_check(model.check(str(tiny), registry_source=registry, gpu=one_mib, gpu_memory_utilization=gmu))["model.memory"]
    assert f.status == FAIL and "gpu_memory_utilization" in f.fix
    busy = gpu.GpuInfo("570.133.20", (12, 8), (gpu.Gpu("busy", (8, 9), 49140, 20000),), "test double")
    assert by_check(model.check(str(tiny), registry_source=registry, gpu=busy, gpu_memory_utilization=0.6))["model.free_memory"].status == FAIL


# ------------------------------------------------------------------ network and ray (real sockets)

@pytest.fixture
def listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_taken_proxy_port_names_the_holder(listening):
    found = by_check(network.check(listening, "127.0.0.1", netstat.listeners()))
    f = found["network.proxy_port"]
    assert f.status == FAIL and f"pid {os.getpid()}" in f.message and "explorer.proxy_port" in f.fix
    assert found["network.listen_address"].status == OK


def test_free_port_and_public_listen_address(listening):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()  # bound, never listened: free again
    found = by_check(network.check(free, "0.0.0.0", netstat.listeners()))
    assert found["network.proxy_port"].status == OK
    assert found["network.listen_address"].status == WARN and "/feedback" in found["network.listen_address"].message
    assert network.conflicts(listening, "0.0.0.0", netstat.listeners())  # a wildcard bind collides with loopback


def test_ray_cluster_file_and_address(tmp_path, listening):
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert ray.find_address(env) == (None, str(tmp_path / "ray" / "ray_current_cluster"))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{listening}\n")
    addr, src = ray.find_address(env)
    ok, why = ray.reachable(addr)
    assert ok and ray.check(addr, src, ok)[0].status == OK
    dead = free_port()  # nothing listens there once it is returned
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{dead}\n")
    addr, src = ray.find_address(env)
    ok, why = ray.reachable(addr)
    assert not ok and ray.check(addr, src, ok, why)[0].status == WARN
    addr, src = ray.find_address({"RAY_ADDRESS": f"127.0.0.1:{dead}"})
    assert src == "RAY_ADDRESS" and ray.check(addr, src, False, "refused")[0].status == FAIL


# ------------------------------------------------------------------ collect / CLI

def test_collect_report_config_on_driver_570(tmp_path, tiny):
    cfg = write_config(tmp_path, tiny)  # the report's config: no max_model_len
    found = doctor.collect(str(cfg), env={**os.environ, "RAY_TMPDIR": str(tmp_path)}, gpu_reader=driver_570)
    fb = by_check(found)
    assert fb["gpu.driver"].status == OK and "12.8" in fb["gpu.driver"].message
    assert fb["elf.torch"].status == FAIL and fb["elf.vllm"].status == FAIL  # problem 3
    f = fb["config.trinity"]  # Trinity's own refusal, run in a subprocess by collect
    assert f.status == FAIL and "Unable to determine `max_model_len`" in f.message
    assert f"max_model_len: {tinymodel.MAX_POSITION}" in f.fix  # from the model's config.json
    assert fb["rl-loop.weight_sync"].status == WARN
    assert fb["network.listen_address"].status == WARN
    assert fb["model.memory"].status == OK
    assert fb["vllm-api.imports"].status == OK and fb["vllm-api.weight_transfer_backend"].status == OK


def test_collect_on_driver_580_has_no_binary_failures(tmp_path):
    found = doctor.collect(None, env={**os.environ, "RAY_TMPDIR": str(tmp_path)}, gpu_reader=driver_580, skip={"toolchain"})
    assert [f for f in found if f.check.startswith("elf") and f.status != OK] == []
    assert not any(f.check == "toolchain.ptxas" for f in found)


def test_unknown_skip_is_a_user_error():
    with pytest.raises(rftstack.errors.UserError):
        doctor.collect(None, skip={"gpus"}, gpu_reader=driver_580)


def test_cli_json_imports_nothing_heavy(tmp_path):
    code = ("import sys, json; from rftstack.cli import main; rc = main(['doctor', '--json']); "
            "print('HEAVY', sorted(m for m in ('torch','vllm','ray','trinity','transformers') if m in sys.modules)); sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": PKG_PARENT, "RAY_TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    body, heavy = proc.stdout.rsplit("HEAVY", 1)
    assert heavy.strip() == "[]"
    data = json.loads(body)
    assert data["command"] == "doctor" and data["findings"]
    assert proc.returncode == (1 if data["status"] == FAIL else 0)
