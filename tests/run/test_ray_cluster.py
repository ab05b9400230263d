"""A real two-node Ray cluster on a private network of namespaces made by the test (root only):
`rftstack ray-head --listen` in one, `rftstack ray-worker` in the other.

Shown here: a worker without the token is refused by rftstack before anything starts; one with a
wrong token is refused by Ray itself (its GCS answers InvalidAuthToken to the `ray start` of the
node; guards an upstream behaviour); with the token it joins and a driver sees two nodes; every
listening socket of the cluster is on the node's private address or loopback, or on a wildcard
address that reaches only those two (the namespace has no other interface): Ray 2.60 binds its
gRPC servers to the wildcard, and rftstack reports exactly those ports; `rftstack doctor
--ray-address` reports both nodes; `rftstack serve --ray-address` on the head, with the trinity
test double, gets its engine actor (which asks for a GPU) placed on the worker and its explorer
actor (made by Trinity's own, patched `Explorer.get_actor`; it serves the proxy) on the head, and
answers on the head's loopback; Trinity's `get_actor` as published lets Ray place the explorer on
the idle worker when the head's CPUs are taken, the patched one keeps it on the node it is given
(trinity-explorer-node.patch); `rftstack doctor --ray-address` with a train config finds the
checkpoint root and the experience store shared by both nodes, and `rftstack train --ray-address`
fails its preflight on `cluster.experience_store` when they are on the head's disk only (the worker
has a directory of its own at that path); stopping the worker (SIGTERM to `ray-worker --block`) and then the
head (`ray-head --stop`) leaves no process in either namespace.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rftstack.run import ray_head, train_config

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

    # two CPUs on the head (the placement check below fills them)
    head_args = ["--num-cpus", "2", *common[2:]]
    out = cli(net, head_ns, "ray-head", "--listen", head_ip, "--state-dir", str(tmp_path / "head"), *head_args, env=env)
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
    # has none); a driver on the head sees both nodes. `private` is a directory of its own on the
    # worker (a tmpfs in its mount namespace): a local disk, where the head's files are not
    private = tmp_path / "private"
    (private / "p" / "n" / "buffer").mkdir(parents=True)
    gpu_join = [a if a != "0" or join[i - 1] != "--num-gpus" else "1" for i, a in enumerate(join)]
    own_disk = ["sh", "-c", 'mount -t tmpfs rftstack-private "$0" && exec "$@"', str(private)]
    blocked = subprocess.Popen(net.cmd(worker_ns, [*own_disk, sys.executable, "-m", "rftstack", *gpu_join, "--token-file", str(token), "--block"]),
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

    # the doctor sees both nodes, the worker's GPU, one clock, the token, and the shared paths on each
    # node (a train config: the experience store's directory too)
    (tmp_path / "model").mkdir()
    ckpt = tmp_path / "ckpt"
    (ckpt / "p" / "n" / "buffer").mkdir(parents=True)
    dcfg = tmp_path / "doctor.yaml"
    dconf = train_config.example(str(tmp_path / "model"), checkpoint_root_dir=str(ckpt), project="p", name="n")
    dconf["buffer"]["trainer_input"] = {"experience_buffer": train_config.store_config(dconf)}  # as `rftstack train` sets it
    dcfg.write_text(yaml.safe_dump(dconf))
    out = cli(net, head_ns, "doctor", "--ray-address", head["address"], "--ray-token-path", head["token_path"], "--json", "-c", str(dcfg),
              *[f"--skip={c}" for c in ("gpu", "elf", "toolchain", "pyenv", "vllm-api", "config", "rl-loop", "model")], env=env)
    found = {f["check"]: f for f in json.loads(out.stdout)["findings"]}
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert found["cluster.nodes"]["data"]["gpus_per_node"] == {head_ip: 0, worker_ip: 1}
    assert found[f"cluster.node.{worker_ip}"]["status"] == "ok" and found[f"cluster.node.{head_ip}"]["status"] == "ok"
    assert found["cluster.clock"]["status"] == "ok" and set(found["cluster.clock"]["data"]["offsets_s"]) == {head_ip, worker_ip}
    assert found["cluster.token"]["status"] == "ok"
    assert found["cluster.model_path"]["status"] == "ok" and "on every GPU node (1)" in found["cluster.model_path"]["message"]
    assert found["cluster.checkpoint_root"]["status"] == "ok" and "every node (2), the same directory on each" in found["cluster.checkpoint_root"]["message"]
    assert found["cluster.experience_store"]["status"] == "ok" and "every GPU node (1)" in found["cluster.experience_store"]["message"]
    assert not list(ckpt.glob(".rftstack-shared-*")) and not list((ckpt / "p" / "n" / "buffer").glob(".rftstack-shared-*"))

    # train's preflight, joined to the cluster, with its checkpoint root (and so its experience
    # store) on this machine's disk only, not the worker's: it fails on cluster.experience_store
    if os.environ.get("RFTSTACK_TEST_SKIP_DOCTOR") != "1":
        tcfg = tmp_path / "train.yaml"
        tcfg.write_text(yaml.safe_dump(train_config.example(str(tmp_path / "model"), checkpoint_root_dir=str(private), project="p", name="n")))
        train = serve_runner(["--ray-address", head["address"], "--ray-token-path", head["token_path"], "-c", str(tcfg)], command="train",
                             prefix=net.cmd(head_ns, []), HOME=str(tmp_path))  # fmt: skip
        assert train.finish(timeout=600) == 1, train.stderr[-3000:]
        assert "cluster.experience_store" in train.status()["exit_reason"], train.status()
        log = (train.run_dir / "logs" / "train.log").read_text()
        assert f"(SQLite) is not on shared storage: GPU node(s) {worker_ip}, where Ray may place the trainer" in log, log[-3000:]
        assert f"is not shared: node(s) {worker_ip} have another directory" in log

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

    # serve on the head: the engine actor (asking for a GPU) runs on the worker, the explorer actor
    # (Trinity's get_actor, which serve pins with RFTSTACK_EXPLORER_NODE) and its proxy on the head
    explorer_py = installed_explorer()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: serve\nmodel:\n  model_path: /models/m\ncluster: {node_num: 1, gpu_per_node: 1}\nexplorer: {}\n")
    run = serve_runner(["--skip-doctor", "--port", "0", "--ray-address", head["address"], "--ray-token-path", head["token_path"],
                        "-c", str(cfg)], fake="engine_gpu,explorer_actor", prefix=net.cmd(head_ns, []), HOME=str(tmp_path))  # fmt: skip
    ready = run.wait_event("ready", timeout=300)
    assert ready, (run.finish() or "") and run.stderr[-3000:]
    placed = json.loads((tmp_path / "fake-pids.json").read_text())
    assert (placed["engine_node"], placed["explorer_node"]) == (worker_ip, head_ip)
    assert f"RFTSTACK_EXPLORER_NODE={head_ip}" in (run.run_dir / "logs" / "serve.log").read_text()
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

    # Trinity's get_actor as published: Ray runs the explorer on the head while it has a free CPU,
    # on the idle worker once the head's CPUs are taken (so does the patched code switched off with
    # an empty RFTSTACK_EXPLORER_NODE); the patched code runs it on the head all the same (an actor
    # holds no CPU once it runs); an address that is no live node is one sentence
    original = tmp_path / "explorer_original.py"
    original.write_text(unpatched_explorer(explorer_py.read_text()))
    out = subprocess.run(net.cmd(head_ns, [sys.executable, "-c", PLACEMENT, head_ip, str(explorer_py), str(original)]),
                         env={**env, **head["env"]}, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    placement = json.loads(out.stdout.split("PLACEMENT ", 1)[1])
    assert placement == {"original_head_free": head_ip, "original": worker_ip, "switched_off": worker_ip,
                         "patched": head_ip,
                         "unknown": "RFTSTACK_EXPLORER_NODE=10.255.255.254 is not the address of a live node of this Ray cluster; "
                                    "set it to the address of the node where the proxy must run, or to nothing to let Ray place it"}  # fmt: skip

    # stopping the worker (SIGTERM to the foreground command), then the head, leaves nothing in either namespace
    blocked.send_signal(signal.SIGTERM)
    assert blocked.wait(timeout=120) == 0, blocked.stderr.read()[-2000:]
    assert net.pids(worker_ns) == []
    out = cli(net, head_ns, "ray-head", "--stop", "--state-dir", str(tmp_path / "head"), "--json", env=env, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["stopped"] is True, out.stdout + out.stderr
    assert net.pids(head_ns) == []


def installed_explorer() -> Path:
    """trinity/explorer/explorer.py as installed: with trinity-explorer-node.patch (rftstack relax)."""
    import trinity

    path = Path(trinity.__file__).parent / "explorer" / "explorer.py"
    assert "RFTSTACK_EXPLORER_NODE" in path.read_text(), f"{path} lacks trinity-explorer-node.patch; run `rftstack relax`"
    return path


def unpatched_explorer(text: str) -> str:
    """explorer.py as published: the installed text with trinity-explorer-node.patch reversed."""
    from rftstack.stack import patches

    out = patches.undo(text, patches.patches_dir() / "trinity-explorer-node.patch", "trinity/explorer/explorer.py")
    assert "RFTSTACK_EXPLORER_NODE" not in out
    return out


# Explorer.get_actor from an explorer.py, on its own (the module imports vLLM and torch), creating
# a probe actor in place of the Explorer: where does Ray run it?
PLACEMENT = """
import ast, json, os, sys, time, types
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

def get_actor_of(path):
    src = open(path).read()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "Explorer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "get_actor")
    lines = src.splitlines()[fn.decorator_list[0].lineno - 1 : fn.end_lineno]
    ns = {"os": os, "ray": ray, "Config": object}
    exec("class Explorer:\\n" + "\\n".join(lines) + "\\n", ns)
    return ns["Explorer"].get_actor.__func__

class Probe:
    def __init__(self, config):
        pass
    def node(self):
        return ray.util.get_node_ip_address()

def explorer(path, node, name):
    os.environ.pop("RFTSTACK_EXPLORER_NODE", None)
    if node is not None:
        os.environ["RFTSTACK_EXPLORER_NODE"] = node
    return get_actor_of(path)(Probe, types.SimpleNamespace(explorer=types.SimpleNamespace(name=name), ray_namespace="placement"))

def settle(cpus):
    end = time.time() + 60
    while ray.available_resources().get("CPU", 0) < cpus and time.time() < end:
        time.sleep(0.2)

head, patched, original = sys.argv[1:4]
ray.init(log_to_driver=False, logging_level="ERROR")
ids = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
total = ray.cluster_resources()["CPU"]
head_cpus = next(n["Resources"]["CPU"] for n in ray.nodes() if n["NodeManagerAddress"] == head)
out = {}
a = explorer(original, None, "e0")
out["original_head_free"] = ray.get(a.node.remote(), timeout=120)
ray.kill(a)
settle(total)
load = ray.remote(num_cpus=head_cpus)(Probe).options(scheduling_strategy=NodeAffinitySchedulingStrategy(ids[head], soft=False)).remote(None)
assert ray.get(load.node.remote()) == head
for name, path, node in (("original", original, None), ("switched_off", patched, "")):
    a = explorer(path, node, "e-" + name)
    out[name] = ray.get(a.node.remote(), timeout=120)
    ray.kill(a)
    settle(total - head_cpus)
a = explorer(patched, head, "e-patched")
out["patched"] = ray.get(a.node.remote(), timeout=120)
try:
    explorer(patched, "10.255.255.254", "e-unknown")
    out["unknown"] = "created"
except RuntimeError as exc:
    out["unknown"] = str(exc)
print("PLACEMENT " + json.dumps(out))
"""


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
