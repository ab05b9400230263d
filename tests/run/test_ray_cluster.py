"""A real two-node Ray cluster on a private network of namespaces made by the test (root only):
`rftstack ray-head --listen` in one, `rftstack ray-worker` in the other.

Shown here: a worker without the token is refused by rftstack before anything starts; one with a
wrong token is refused by Ray itself (its GCS answers InvalidAuthToken to the `ray start` of the
node; guards an upstream behaviour); with the token it joins and a driver sees two nodes; every
listening socket of the cluster is on the node's private address or loopback, or on a wildcard
address that reaches only those two (the namespace has no other interface): Ray 2.60 binds its
gRPC servers to the wildcard, and rftstack reports exactly those ports; `rftstack doctor
--ray-address` reports both nodes; `rftstack serve --ray-address` on the head, with the trinity
test double, gets its engine actor (which asks for a GPU) placed on the worker and answers on the
head's loopback; stopping the worker (SIGTERM to `ray-worker --block`) and then the head
(`ray-head --stop`) leaves no process in either namespace.
"""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rftstack.run import ray_head

from helpers import rftstack_env
from netns_helpers import PrivateNet, unavailable

pytestmark = pytest.mark.slow

WILDCARD = ("0.0.0.0", "::")


@pytest.fixture
def net(request, tmp_path):
    why = unavailable()
    if why:
        pytest.skip(why)
    net = PrivateNet(2)
    temp_dirs: list[str] = []
    net.temp_dirs = temp_dirs

    def cleanup():
        net.destroy()
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)

    request.addfinalizer(cleanup)
    return net


def cli(net, ns, *args, env, timeout=300):
    return subprocess.run(net.cmd(ns, [sys.executable, "-m", "rftstack", *args]), env=env, capture_output=True, text=True, timeout=timeout)


def engines(net, ns) -> list[int]:
    """Processes in ``ns`` titled as vLLM titles its engine (the double does the same)."""
    found = []
    for pid in net.pids(ns):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"VLLM::"):
                found.append(pid)
        except OSError:
            pass
    return found


def node_addresses(l) -> str:
    ip = l.address
    return ip[7:] if ip.startswith("::ffff:") else ip


def test_two_nodes_token_private_sockets_serve_clean_stop(net, tmp_path, serve_runner):
    (head_ns, head_ip), (worker_ns, worker_ip) = net.nodes
    env = rftstack_env(HOME=str(tmp_path))  # no ~/.ray/auth_token can help a node
    common = ["--num-cpus", "1", "--num-gpus", "0", "--json"]

    out = cli(net, head_ns, "ray-head", "--listen", head_ip, "--state-dir", str(tmp_path / "head"), *common, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    head = json.loads(out.stdout)
    net.temp_dirs.append(head["temp_dir"])
    assert head["address"] == f"{head_ip}:{head['ports']['gcs']}" and head["env"]["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    token = tmp_path / "copy_of_token"
    token.write_text(open(head["token_path"]).read())
    token.chmod(0o600)
    wstate = str(tmp_path / "worker")
    join = ["ray-worker", "--address", head["address"], "--state-dir", wstate, *common]

    # rftstack refuses a node without a token, at once, leaving nothing running
    out = cli(net, worker_ns, *join, env=env, timeout=60)
    assert out.returncode == 2 and "--token-file" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert net.pids(worker_ns) == []

    # Ray itself refuses a node with a wrong token (its GCS answers InvalidAuthToken)
    before = {d.name for d in Path("/tmp").glob("rfts-rayw-*")}
    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    out = cli(net, worker_ns, *join, "--token-file", str(wrong), env=env)
    assert out.returncode == 1 and "refused this node's token (Ray: InvalidAuthToken)" in out.stderr, out.stderr[-2000:]
    assert "InvalidAuthToken" in (tmp_path / "worker" / "ray-start.log").read_text()
    assert net.pids(worker_ns) == [] and not [d for d in Path("/tmp").glob("rfts-rayw-*") if d.name not in before]

    # with the token it joins (in the foreground, advertising one GPU: a resource count, this machine
    # has none); a driver on the head sees both nodes
    gpu_join = [a if a != "0" or join[i - 1] != "--num-gpus" else "1" for i, a in enumerate(join)]
    blocked = subprocess.Popen(net.cmd(worker_ns, [sys.executable, "-m", "rftstack", *gpu_join, "--token-file", str(token), "--block"]),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    line = blocked.stdout.readline()
    assert line, blocked.stderr.read()[-3000:]
    worker = json.loads(line)
    net.temp_dirs.append(worker["temp_dir"])
    assert worker["node_ip"] == worker_ip and worker["role"] == "worker" and worker["resources"]["CPU"] == 1.0
    nodes = subprocess.run(net.cmd(head_ns, [sys.executable, "-c", NODES]), env={**env, **head["env"]},
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert nodes.returncode == 0, nodes.stderr[-2000:]
    assert sorted(json.loads(nodes.stdout.splitlines()[-1])) == sorted([head_ip, worker_ip])

    # the doctor sees both nodes, the worker's GPU, one clock, the token, and the shared paths on each node
    (tmp_path / "model").mkdir()
    dcfg = tmp_path / "doctor.yaml"
    dcfg.write_text(f"mode: serve\nmodel:\n  model_path: {tmp_path / 'model'}\ncheckpoint_root_dir: {tmp_path / 'ckpt'}\n")
    out = cli(net, head_ns, "doctor", "--ray-address", head["address"], "--ray-token-path", head["token_path"], "--json", "-c", str(dcfg),
              *[f"--skip={c}" for c in ("gpu", "elf", "toolchain", "pyenv", "vllm-api", "config", "rl-loop", "model")], env=env)
    found = {f["check"]: f for f in json.loads(out.stdout)["findings"]}
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert found["cluster.nodes"]["data"]["gpus_per_node"] == {head_ip: 0, worker_ip: 1}
    assert found[f"cluster.node.{worker_ip}"]["status"] == "ok" and found[f"cluster.node.{head_ip}"]["status"] == "ok"
    assert found["cluster.clock"]["status"] == "ok" and set(found["cluster.clock"]["data"]["offsets_s"]) == {head_ip, worker_ip}
    assert found["cluster.token"]["status"] == "ok"
    assert found["cluster.model_path"]["status"] == "ok" and "on every GPU node (1)" in found["cluster.model_path"]["message"]
    assert found["cluster.checkpoint_root"]["status"] == "ok" and "every node (2)" in found["cluster.checkpoint_root"]["message"]

    # listening sockets: the node's private address, loopback, or a wildcard that reaches only those
    for ns, ip, info in ((head_ns, head_ip, head), (worker_ns, worker_ip, worker)):
        dev = f"rfc{net.id}v{net.nodes.index((ns, ip))}"
        addrs = net.addresses(ns)  # the wildcard reaches these, and no others
        assert set(addrs) == {"lo", dev} and ip in addrs[dev]
        assert all(a == ip or a.startswith("fe80:") for a in addrs[dev])  # the private link only
        socks = net.listeners(ns)
        assert socks
        bad = [(l.address, l.port) for l in socks if node_addresses(l) not in (ip, "127.0.0.1", "::1", *WILDCARD)]
        assert bad == []
        wild = {l.port for l in socks if l.address in WILDCARD}
        named = {name: port for name, port in info["ports"].items() if port in wild}
        assert named == info["wildcard_ports"]  # rftstack reports the node's own wildcard ports truthfully
        assert {"node_manager", "object_manager", "dashboard_agent_grpc", "metrics_export"} <= set(named)  # Ray 2.60's choice
        lo, hi = ray_head.WORKER_PORT_RANGE
        assert all(lo <= p <= hi for p in wild - set(named.values()))  # the rest: Ray's worker processes

    # serve on the head: the engine actor (asking for a GPU) runs on the worker, the proxy on the head
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\ncluster: {node_num: 1, gpu_per_node: 1}\nexplorer: {}\n")
    run = serve_runner(["--skip-doctor", "--port", "0", "--ray-address", head["address"], "--ray-token-path", head["token_path"],
                        "-c", str(cfg)], fake="engine_gpu", prefix=net.cmd(head_ns, []), HOME=str(tmp_path))  # fmt: skip
    ready = run.wait_event("ready", timeout=300)
    assert ready, (run.finish() or "") and run.stderr[-3000:]
    assert json.loads((tmp_path / "fake-pids.json").read_text())["engine_node"] == worker_ip
    assert engines(net, worker_ns) and not engines(net, head_ns)
    proxy = f"http://127.0.0.1:{run.status()['proxy_port']}"
    models = subprocess.run(net.cmd(head_ns, [sys.executable, "-c", f"import urllib.request; print(urllib.request.urlopen('{proxy}/v1/models', timeout=10).read().decode())"]),
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert models.returncode == 0 and "/models/m" in models.stdout, models.stderr[-2000:]
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.stderr[-3000:]
    end = time.monotonic() + 60  # Ray kills the actors of a driver that is gone, in its own time
    while engines(net, worker_ns) and time.monotonic() < end:
        time.sleep(0.5)
    assert not engines(net, worker_ns)

    # stopping the worker (SIGTERM to the foreground command), then the head, leaves nothing in either namespace
    blocked.send_signal(signal.SIGTERM)
    assert blocked.wait(timeout=120) == 0, blocked.stderr.read()[-2000:]
    assert net.pids(worker_ns) == []
    out = cli(net, head_ns, "ray-head", "--stop", "--state-dir", str(tmp_path / "head"), "--json", env=env, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["stopped"] is True, out.stdout + out.stderr
    assert net.pids(head_ns) == []


NODES = """
import json, ray
ray.init(log_to_driver=False, logging_level="ERROR")
print(json.dumps([n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]))
"""


def write_tls(directory, ips: list[str]) -> tuple[str, str, str]:
    """One self-signed certificate (its own CA) naming every node's address, as Ray's own TLS tests do."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rftstack-test-cluster")])
    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in [*ips, "127.0.0.1"]] + [x509.DNSName(ip) for ip in [*ips, "127.0.0.1"]]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False).sign(key, hashes.SHA256()))  # fmt: skip
    cert_path, key_path = directory / "node.crt", directory / "node.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path), str(cert_path)


TLS_HANDSHAKE = """
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[3])
ctx.load_cert_chain(sys.argv[3], sys.argv[4])
ctx.set_alpn_protocols(["h2"])
with ctx.wrap_socket(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10), server_hostname=sys.argv[1]) as s:
    print(s.version())
"""


def test_tls_between_nodes(net, tmp_path):
    """--tls-cert/--tls-key/--tls-ca: both nodes run Ray with TLS, the worker joins, a driver given
    the same variables sees both nodes, and the head's GCS port completes a TLS handshake."""
    (head_ns, head_ip), (worker_ns, worker_ip) = net.nodes
    env = rftstack_env(HOME=str(tmp_path))
    cert, key, ca = write_tls(tmp_path, [head_ip, worker_ip])
    tls = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca]
    common = ["--num-cpus", "1", "--num-gpus", "0", "--json", *tls]
    out = cli(net, head_ns, "ray-head", "--listen", head_ip, "--state-dir", str(tmp_path / "head"), *common, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    head = json.loads(out.stdout)
    net.temp_dirs.append(head["temp_dir"])
    assert head["env"]["RAY_USE_TLS"] == "1" and head["env"]["RAY_TLS_CA_CERT"] == ca
    out = cli(net, worker_ns, "ray-worker", "--address", head["address"], "--token-file", head["token_path"],
              "--state-dir", str(tmp_path / "worker"), *common, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    worker = json.loads(out.stdout)
    net.temp_dirs.append(worker["temp_dir"])
    assert worker["tls"] == head["tls"]
    nodes = subprocess.run(net.cmd(head_ns, [sys.executable, "-c", NODES]), env={**env, **head["env"]}, capture_output=True, text=True, timeout=120)
    assert nodes.returncode == 0, nodes.stderr[-2000:]
    assert sorted(json.loads(nodes.stdout.splitlines()[-1])) == sorted([head_ip, worker_ip])
    hs = subprocess.run(net.cmd(worker_ns, [sys.executable, "-c", TLS_HANDSHAKE, head_ip, str(head["ports"]["gcs"]), ca, key]),
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert hs.returncode == 0 and hs.stdout.strip().startswith("TLSv1"), hs.stderr[-2000:]
    for ns, role, state in ((worker_ns, "ray-worker", "worker"), (head_ns, "ray-head", "head")):
        out = cli(net, ns, role, "stop", "--state-dir", str(tmp_path / state), "--json", env=env, timeout=120)
        assert out.returncode == 0 and json.loads(out.stdout)["stopped"] is True, out.stdout + out.stderr
        assert net.pids(ns) == []
