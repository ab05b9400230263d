"""Pure decisions of a multi-node cluster: listen addresses, token and TLS files (cluster_net),
and the doctor's per-node verdicts (checks.cluster)."""

import socket

import pytest

from rftstack.doctor.checks import cluster
from rftstack.doctor import cluster_net
from rftstack.run import ray_head, ray_worker
from rftstack.findings import FAIL, INFO, OK, WARN

from helpers import run_cli


def test_listen_problem():
    assert cluster_net.listen_problem("10.0.0.1", allow_public=False, local=True) is None
    assert cluster_net.listen_problem("192.168.1.5", allow_public=False, local=True) is None
    assert "all of them" in cluster_net.listen_problem("0.0.0.0", allow_public=False, local=True)
    assert "all of them" in cluster_net.listen_problem("::", allow_public=True, local=True)  # never: Ray advertises it
    assert "public address" in cluster_net.listen_problem("8.8.8.8", allow_public=False, local=True)
    assert cluster_net.listen_problem("8.8.8.8", allow_public=True, local=True) is None
    assert "not an address of this machine" in cluster_net.listen_problem("10.9.9.9", allow_public=False, local=False)
    assert "not an IP address" in cluster_net.listen_problem("head.example", allow_public=False, local=True)


def test_is_local_address_and_route_source():
    assert cluster_net.is_local_address("127.0.0.1")
    assert not cluster_net.is_local_address("192.0.2.77")  # TEST-NET-1, on no interface
    assert cluster_net.route_source("127.0.0.1", 9) == "127.0.0.1"


def test_split_address():
    assert cluster_net.split_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    for bad in ("10.0.0.1", "10.0.0.1:x", ":6379", "10.0.0.1:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            cluster_net.split_address(bad)


def test_token_problem(tmp_path):
    assert "--token-file" in cluster_net.token_problem(None)
    assert "does not exist" in cluster_net.token_problem(tmp_path / "nope")
    t = tmp_path / "tok"
    t.write_text("")
    t.chmod(0o600)
    assert "empty" in cluster_net.token_problem(t)
    t.write_text("ab" * 32)
    t.chmod(0o644)
    assert "chmod 600" in cluster_net.token_problem(t)
    t.chmod(0o600)
    assert cluster_net.token_problem(t) is None


def test_tls_env(tmp_path):
    assert cluster_net.tls_env(None, None, None) == ({}, None)
    c, k, a = (tmp_path / n for n in ("c.pem", "k.pem", "ca.pem"))
    for p in (c, k, a):
        p.write_text("x")
    env, problem = cluster_net.tls_env(c, k, a)
    assert problem is None
    assert env == {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(c), "RAY_TLS_SERVER_KEY": str(k), "RAY_TLS_CA_CERT": str(a)}
    assert "--tls-ca missing" in cluster_net.tls_env(c, k, None)[1]
    assert "not a readable file" in cluster_net.tls_env(c, k, tmp_path / "nope")[1]
    # every node and every client gets them
    assert ray_head.client_env("10.0.0.1:6379", "/t", env)["RAY_TLS_CA_CERT"] == str(a)


def test_client_env_cluster_mode_only_off_loopback():
    assert ray_head.client_env("127.0.0.1:1", "/t")["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert ray_head.client_env("10.0.0.1:1", "/t")["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"


def test_worker_argv_names_its_ports_and_address():
    ports = dict(zip(ray_worker.WORKER_PORTS, range(21000, 21000 + len(ray_worker.WORKER_PORTS))))
    argv = ray_worker.worker_argv("ray", "10.0.0.1:6379", "10.0.0.2", ports, "/tmp/x", 1, None)
    assert argv[:4] == ["ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"]
    assert "--head" not in argv and all(str(p) in " ".join(argv) for p in ports.values())


def test_head_reachable_names_the_address():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    assert f"127.0.0.1:{port} cannot be reached" in ray_worker.head_reachable("127.0.0.1", port)


def test_flavour_cuda():
    assert cluster.flavour_cuda({"torch": "12.8", "vllm": "cu128"}) == (12, 8)
    assert cluster.flavour_cuda({"torch": "13.0"}) == (13, 0)
    assert cluster.flavour_cuda({"torch": None, "vllm": "cu129"}) == (12, 9)
    assert cluster.flavour_cuda({"torch": None, "vllm": "PyPI default (CUDA 13 for vllm >= 0.20)"}) == (13, 0)
    assert cluster.flavour_cuda({"torch": None, "vllm": None}) is None


def gpu_node(ip, driver, torch, max_cuda=None):
    return {"ip": ip, "alive": True, "gpus": 1, "report": {"hostname": "h", "driver": driver, "driver_max_cuda": max_cuda,
            "gpus": [{"name": "NVIDIA H200"}], "flavour": {"torch": torch, "vllm": None}}}


def test_driver_570_node_must_not_run_cuda_13_wheels():
    [f] = cluster.node_findings(gpu_node("10.0.0.2", "570.133.20", "13.0"))
    assert f.status == FAIL and "CUDA up to 12.8" in f.message and "CUDA 13.0" in f.message and "580" in f.fix
    assert cluster.node_findings(gpu_node("10.0.0.2", "570.133.20", "12.8"))[0].status == OK
    assert cluster.node_findings(gpu_node("10.0.0.2", "580.65", "13.0"))[0].status == OK
    # what NVML reports wins over the table
    assert cluster.node_findings(gpu_node("10.0.0.2", "999.1", "13.0", max_cuda=[12, 8]))[0].status == FAIL


def test_node_findings_cpu_dead_and_missing_stack():
    cpu = {"ip": "10.0.0.1", "alive": True, "gpus": 0, "report": {"hostname": "h", "driver": None, "gpus": [], "flavour": {"torch": "13.0"}}}
    assert cluster.node_findings(cpu)[0].status == OK  # no GPU there: the flavour does not matter
    assert cluster.node_findings({"ip": "10.0.0.3", "alive": False, "gpus": 0})[0].status == WARN
    bare = {"ip": "10.0.0.4", "alive": True, "gpus": 0, "report": {"error": "rftstack is not importable on this node (x)"}}
    assert cluster.node_findings(bare)[0].status == FAIL


def test_skew_finding():
    nodes = [{"ip": "a", "clock": {"offset_s": 0.01, "uncertainty_s": 0.002}}, {"ip": "b", "clock": {"offset_s": -5.0, "uncertainty_s": 0.01}}]
    f = cluster.skew_finding(nodes)
    assert f.status == WARN and "b" in f.message and "-5.0 s" in f.message
    assert cluster.skew_finding(nodes[:1]).status == OK
    # a slow answer is no evidence of skew
    assert cluster.skew_finding([{"ip": "c", "clock": {"offset_s": 3.0, "uncertainty_s": 2.5}}]).status == OK
    assert cluster.skew_finding([]).status == WARN


def test_check_when_the_cluster_does_not_answer(tmp_path):
    found = cluster.check("10.0.0.1:6379", None, "refused", None)
    assert [f.status for f in found] == [FAIL, FAIL]
    assert "--token-file" in found[0].message and "did not answer" in found[1].message


@pytest.mark.parametrize("args, says", [
    (["ray-head", "--listen", "0.0.0.0"], "is not one interface but all of them"),
    (["ray-head", "--listen", "8.8.8.8"], "is a public address"),
    (["ray-head", "--listen", "192.0.2.77"], "is not an address of this machine"),
    (["ray-head", "--listen", "127.0.0.1", "--tls-cert", "c.pem"], "TLS needs --tls-cert, --tls-key and --tls-ca together"),
    (["ray-worker"], "needs the head's address"),
    (["ray-worker", "--address", "10.0.0.1:6379"], "pass --token-file FILE"),
    (["ray-worker", "--address", "10.0.0.1", "--token-file", "__TOKEN__"], "is not HOST:PORT"),
])
def test_cli_refuses_with_one_sentence_before_starting_anything(tmp_path, args, says):
    token = tmp_path / "tok"
    token.write_text("ab" * 32)
    token.chmod(0o600)
    args = [str(token) if a == "__TOKEN__" else a for a in args]
    out = run_cli(*args, "--state-dir", str(tmp_path / "state"), timeout=60)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


def path_node(ip, gpus, model_exists, ckpt_writable):
    return {"ip": ip, "alive": True, "gpus": gpus, "report": {"paths": {
        "model": {"exists": model_exists, "writable": True}, "checkpoints": {"exists": True, "writable": ckpt_writable}}}}


def test_paths_findings():
    paths = {"model": "/models/q", "checkpoints": "/shared/ckpt"}
    head, worker = path_node("10.0.0.1", 0, False, True), path_node("10.0.0.2", 1, True, True)
    found = {f.check: f for f in cluster.paths_findings([head, worker], paths)}
    assert found["cluster.model_path"].status == OK  # the head runs no engine: it needs no model
    assert found["cluster.checkpoint_root"].status == OK
    worker = path_node("10.0.0.2", 1, False, False)
    found = {f.check: f for f in cluster.paths_findings([head, worker], paths)}
    assert found["cluster.model_path"].status == FAIL and "10.0.0.2" in found["cluster.model_path"].message
    assert found["cluster.checkpoint_root"].status == WARN and found["cluster.checkpoint_root"].data == {"not_writable_on": ["10.0.0.2"]}
    assert cluster.paths_findings([head, worker], {}) == []


def marked_node(ip, gpus, sees: dict):
    node = path_node(ip, gpus, True, True)
    node["report"]["markers"] = sees
    return node


def test_shared_directories_by_marker(tmp_path):
    """A node that reads another content (or nothing) at a marker's path has another directory
    there: the checkpoint root is not shared (WARN); a train run's SQLite store is not on a GPU
    node where Ray may place the trainer (FAIL)."""
    (tmp_path / "ckpt").mkdir()
    markers = cluster.place_markers({"checkpoints": str(tmp_path / "ckpt"), "store": str(tmp_path / "missing")})
    assert set(markers) == {"checkpoints"}  # no marker where the directory does not exist here
    path, content = markers["checkpoints"]
    assert open(path).read() == content and path.startswith(str(tmp_path / "ckpt"))
    cluster.remove_markers(markers)
    assert list((tmp_path / "ckpt").iterdir()) == []

    paths = {"model": "/models/q", "checkpoints": "/shared/ckpt"}
    marks = {"checkpoints": ["/shared/ckpt/.m", "x"], "store": ["/shared/ckpt/p/buffer/.m", "y"]}
    url = "sqlite:////shared/ckpt/p/buffer/experience_buffer.db"
    head = marked_node("10.0.0.1", 0, {"checkpoints": True, "store": True})
    worker = marked_node("10.0.0.2", 1, {"checkpoints": False, "store": False})
    found = {f.check: f for f in cluster.paths_findings([head, worker], paths, marks, url)}
    assert found["cluster.checkpoint_root"].status == WARN and found["cluster.checkpoint_root"].data == {"not_shared_on": ["10.0.0.2"]}
    store = found["cluster.experience_store"]
    assert store.status == FAIL and store.data == {"not_shared_on": ["10.0.0.2"]} and "/shared/ckpt/p/buffer" in store.message
    assert "checkpoint_root_dir" in store.fix
    worker = marked_node("10.0.0.2", 1, {"checkpoints": True, "store": True})
    found = {f.check: f for f in cluster.paths_findings([head, worker], paths, marks, url)}
    assert found["cluster.checkpoint_root"].status == OK and "the same directory on each" in found["cluster.checkpoint_root"].message
    assert found["cluster.experience_store"].status == OK and "every GPU node (1)" in found["cluster.experience_store"].message
    # the head (no GPU, no trainer) need not see the store; one node needs nothing shared
    head = marked_node("10.0.0.1", 0, {"checkpoints": True, "store": False})
    assert cluster.store_finding([head, worker], url, marks).status == OK
    assert cluster.store_finding([worker], url, {}).status == OK
    # not checkable here (no store directory yet), a database server, no store given
    assert cluster.store_finding([head, worker], url, {"checkpoints": marks["checkpoints"]}).status == WARN
    assert cluster.store_finding([head, worker], "postgresql://db/x", {}).status == INFO
    assert "cluster.experience_store" not in {f.check for f in cluster.paths_findings([head, worker], paths, marks)}
    assert cluster.store_file(url) == "/shared/ckpt/p/buffer/experience_buffer.db" and cluster.store_file("postgresql://db/x") is None
