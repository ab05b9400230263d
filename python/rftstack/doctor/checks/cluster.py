"""A multi-node Ray cluster: its nodes, GPUs per node, each node's driver against the CUDA flavour
installed there (a driver-570 node must not run CUDA 13 wheels), clock skew, and the token.

Each node reports itself through a tiny Ray task pinned to it (NodeAffinitySchedulingStrategy):
its GPUs and driver as `checks.gpu.read` sees them there (NVML, /proc, nvidia-smi), the CUDA
flavour of its torch and vllm (`env_report.cuda_flavour`) and its clock. The driver runs in a
subprocess (`report`) so the doctor itself never imports Ray; the decisions (`check`) are pure.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

from rftstack.doctor.checks.gpu import fmt_cuda, max_cuda_for_driver, min_driver_for_cuda
from rftstack.findings import FAIL, INFO, OK, WARN, Finding

SKEW_LIMIT_S = 2.0  # Ray does not need synchronised clocks; logs, checkpoints and timeouts read better with them

REPORT = r"""
import json, socket, sys, time, site
from pathlib import Path
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

@ray.remote(num_cpus=0)
def describe(paths, markers):
    import os
    out = {"hostname": socket.gethostname(), "ip": ray.util.get_node_ip_address()}
    out["paths"] = {k: {"exists": os.path.exists(v), "writable": os.access(v if os.path.exists(v) else os.path.dirname(v.rstrip("/")) or "/", os.W_OK)}
                    for k, v in paths.items()}
    def sees(path, content):
        try:
            return open(path).read() == content
        except OSError:
            return False
    out["markers"] = {k: sees(*v) for k, v in markers.items()}
    try:
        import dataclasses
        from rftstack.doctor.checks import gpu
        from rftstack.stack import env_report
        info = gpu.read()
        out["driver"] = info.driver_version
        out["driver_max_cuda"] = list(info.max_cuda) if info.max_cuda else None
        out["gpus"] = [dataclasses.asdict(g) for g in info.gpus]
        out["flavour"] = env_report.cuda_flavour(Path(site.getsitepackages()[0]))
    except ImportError as exc:
        out["error"] = f"rftstack is not importable on this node ({exc})"
    return out

@ray.remote(num_cpus=0)
def now():
    return time.time()

paths, markers = json.loads(sys.argv[2]), json.loads(sys.argv[3])
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
nodes = []
for n in ray.nodes():
    row = {"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "alive": n["Alive"], "gpus": n["Resources"].get("GPU", 0)}
    if n["Alive"]:
        pin = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        row["report"] = ray.get(describe.options(scheduling_strategy=pin).remote(paths, markers), timeout=120)
        ray.get(now.options(scheduling_strategy=pin).remote(), timeout=60)  # the worker is warm now
        t0 = time.time(); t = ray.get(now.options(scheduling_strategy=pin).remote(), timeout=60); t1 = time.time()
        row["clock"] = {"offset_s": t - (t0 + t1) / 2, "uncertainty_s": (t1 - t0) / 2}
    nodes.append(row)
print("CLUSTER " + json.dumps(nodes))
"""


def report(address: str, env: dict, paths: dict[str, str] | None = None, timeout: float = 300,
           markers: dict[str, list[str]] | None = None) -> tuple[list[dict] | None, str]:  # fmt: skip
    """Run the report driver against ``address``: (nodes, "") or (None, why it failed). Each node
    also says whether each of ``paths`` (name -> path) exists there and can be written, and whether
    it reads each of ``markers`` (name -> [file, content], see place_markers) as written here."""
    argv = [sys.executable, "-c", REPORT, address, json.dumps(paths or {}), json.dumps(markers or {})]
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    for line in out.stdout.splitlines():
        if line.startswith("CLUSTER "):
            return json.loads(line[len("CLUSTER ") :]), ""
    return None, (out.stderr.strip().splitlines() or ["no output"])[-1]


def place_markers(dirs: dict[str, str]) -> dict[str, list[str]]:
    """A file with random content in each existing, writable directory (name -> directory): a node
    that reads the same content there sees the same directory (shared storage), not a local one of
    the same name. Directories that do not exist here (or cannot be written) get none."""
    out = {}
    for name, d in dirs.items():
        content = secrets.token_hex(16)
        path = Path(d, f".rftstack-shared-{content[:12]}")
        try:
            path.write_text(content)
        except OSError:
            continue
        out[name] = [str(path), content]
    return out


def remove_markers(markers: dict[str, list[str]]) -> None:
    for path, _ in markers.values():
        Path(path).unlink(missing_ok=True)


def store_file(url: str | None) -> str | None:
    """The file of an SQLite URL (sqlite:///PATH), None for another database or none."""
    if not isinstance(url, str) or not url.startswith("sqlite:///"):
        return None
    return url[len("sqlite:///") :] or None


def flavour_cuda(flavour: dict) -> tuple[int, int] | None:
    """The CUDA major.minor the installed wheels were built for: torch's `cuda` ("12.8"), else
    vllm's local tag ("cu128"), else vllm from PyPI (CUDA 13 for vllm >= 0.20)."""
    torch = flavour.get("torch")
    if torch and re.fullmatch(r"\d+\.\d+", torch):
        major, minor = torch.split(".")
        return int(major), int(minor)
    vllm = flavour.get("vllm") or ""
    m = re.fullmatch(r"cu(\d+)(\d)", vllm)
    if m:
        return int(m.group(1)), int(m.group(2))
    return (13, 0) if vllm.startswith("PyPI default") else None


def node_findings(node: dict) -> list[Finding]:
    """One node: alive, its GPUs, and whether its driver runs the CUDA flavour installed on it."""
    ip = node["ip"]
    key = f"cluster.node.{ip}"
    if not node["alive"]:
        return [Finding(key, WARN, f"Node {ip} is registered but dead.", "Restart it (`rftstack ray-worker`) or ignore it: Ray forgets it later.", node)]
    rep = node.get("report") or {}
    if "error" in rep:
        return [Finding(key, FAIL, f"Node {ip}: {rep['error']}.", "Install the stack (with rftstack) on every node.", node)]
    gpus = len(rep.get("gpus") or [])
    driver = rep.get("driver")
    built = flavour_cuda(rep.get("flavour") or {})
    where = f"Node {ip} ({rep.get('hostname', '?')})"
    if gpus == 0:
        return [Finding(key, OK, f"{where}: no GPU, {node['gpus']:g} GPU(s) advertised to Ray; fit for the proxy and the driver.", "", node)]
    runs = max_cuda_for_driver(driver) if driver else None
    if rep.get("driver_max_cuda"):
        runs = tuple(rep["driver_max_cuda"])
    if built is not None and (runs is None or built > runs):
        need = min_driver_for_cuda(built)
        return [Finding(key, FAIL,
                        f"{where}: driver {driver} runs CUDA up to {fmt_cuda(runs)}, but the wheels installed there are built for CUDA {fmt_cuda(built)}.",
                        f"Install the CUDA {fmt_cuda(runs)} flavour of the stack on that node (the flake's default package, cu128), or upgrade its driver to {need or '?'} or newer.",
                        node)]  # fmt: skip
    return [Finding(key, OK, f"{where}: {gpus} GPU(s), driver {driver} (CUDA up to {fmt_cuda(runs)}), wheels for CUDA {fmt_cuda(built)}.", "", node)]


def skew_finding(nodes: list[dict], limit_s: float = SKEW_LIMIT_S) -> Finding:
    """The largest clock offset of a node from the doctor's machine, less its measurement uncertainty."""
    clocks = {n["ip"]: n["clock"] for n in nodes if n.get("clock")}
    if not clocks:
        return Finding("cluster.clock", WARN, "No node's clock could be read.", "Check that the nodes are alive.")
    worst_ip = max(clocks, key=lambda ip: abs(clocks[ip]["offset_s"]))
    c = clocks[worst_ip]
    skew = max(0.0, abs(c["offset_s"]) - c["uncertainty_s"])
    data = {"offsets_s": {ip: round(v["offset_s"], 4) for ip, v in clocks.items()}, "limit_s": limit_s}
    if skew > limit_s:
        return Finding("cluster.clock", WARN, f"Node {worst_ip}'s clock is {c['offset_s']:+.1f} s off this machine's.",
                       "Run NTP (chrony or systemd-timesyncd) on every node.", data)  # fmt: skip
    return Finding("cluster.clock", OK, f"Clocks agree within {max(abs(v['offset_s']) for v in clocks.values()) + c['uncertainty_s']:.3f} s on {len(clocks)} node(s).", "", data)


def unseen(nodes: list[dict], marker: str) -> list[str]:
    """The nodes that do not read the marker ``marker`` as it was written (another directory)."""
    return [n["ip"] for n in nodes if not (n["report"].get("markers") or {}).get(marker)]


def paths_findings(nodes: list[dict], paths: dict[str, str], markers: dict[str, list[str]] | None = None,
                   store: str | None = None) -> list[Finding]:  # fmt: skip
    """What must be shared: the model directory on every node with GPUs (vLLM loads it where its
    engine runs); the checkpoint root writable on every node (Trinity places its synchronizer and
    its trainer where Ray decides), and the same directory on each where it exists here (marker
    ``checkpoints``); with ``store`` (a train config's experience store URL), the store's directory
    the same on every GPU node, where Ray places the trainer (marker ``store``)."""
    out = []
    markers = markers or {}
    alive = [n for n in nodes if n["alive"] and "paths" in (n.get("report") or {})]
    if "model" in paths:
        gpu_nodes = [n for n in alive if n["gpus"] > 0]
        missing = [n["ip"] for n in gpu_nodes if not n["report"]["paths"]["model"]["exists"]]
        if missing:
            out.append(Finding("cluster.model_path", FAIL, f"The model directory {paths['model']} is missing on GPU node(s) {', '.join(missing)}, where the engines run.",
                               "Copy it there at the same path, or mount shared storage at that path on every GPU node.", {"missing_on": missing}))  # fmt: skip
        else:
            out.append(Finding("cluster.model_path", OK, f"The model directory {paths['model']} is on every GPU node ({len(gpu_nodes)}).", ""))
    if "checkpoints" in paths:
        bad = [n["ip"] for n in alive if not n["report"]["paths"]["checkpoints"]["writable"]]
        other = unseen(alive, "checkpoints") if "checkpoints" in markers else []
        if bad:
            out.append(Finding("cluster.checkpoint_root", WARN, f"The checkpoint root {paths['checkpoints']} cannot be written on node(s) {', '.join(bad)}.",
                               "Mount shared storage at that path on every node (experiences, checkpoints and the proxy's history live there).",
                               {"not_writable_on": bad}))  # fmt: skip
        elif other:
            out.append(Finding("cluster.checkpoint_root", WARN,
                               f"The checkpoint root {paths['checkpoints']} is not shared: node(s) {', '.join(other)} have another directory at that path.",
                               "Mount the same shared storage at that path on every node (the trainer writes checkpoints there, the engines load them).",
                               {"not_shared_on": other}))  # fmt: skip
        else:
            shared = ", the same directory on each" if "checkpoints" in markers else ""
            out.append(Finding("cluster.checkpoint_root", OK, f"The checkpoint root {paths['checkpoints']} can be written on every node ({len(alive)}){shared}.", ""))
    if store is not None:
        out.append(store_finding(alive, store, markers))
    return out


def store_finding(alive: list[dict], url: str, markers: dict[str, list[str]]) -> Finding:
    """A train run's experience store on a cluster: Ray places the trainer, which reads the store,
    on a GPU node; the serve's proxy (on the serve's node) writes it. An SQLite file must then be in
    a directory every GPU node shares."""
    key = "cluster.experience_store"
    path = store_file(url)
    if path is None:
        return Finding(key, INFO, f"The experience store {url} is a database server: every GPU node must reach it (not checked).", "")
    if len(alive) < 2:
        return Finding(key, OK, f"The experience store {url} is on the cluster's one node, with the trainer.", "")
    gpu_nodes = [n for n in alive if n["gpus"] > 0] or alive
    where = str(Path(path).parent)
    if "store" not in markers:
        return Finding(key, WARN, f"Whether the GPU nodes share the experience store's directory {where} cannot be checked: it does not exist here (or cannot be written).",
                       "Start `rftstack serve` first (it creates the store), with checkpoint_root_dir on storage every node mounts at the same path.")  # fmt: skip
    other = unseen(gpu_nodes, "store")
    if other:
        return Finding(key, FAIL,
                       f"The experience store {url} (SQLite) is not on shared storage: GPU node(s) {', '.join(other)}, where Ray may place the trainer, have another directory at {where}.",
                       "Put checkpoint_root_dir (the serve's and this config's) on storage every node mounts at the same path, with working file locks "
                       "(SQLite needs them: NFSv4, not a sync tool); or run train on one machine with the serve.",
                       {"not_shared_on": other})  # fmt: skip
    return Finding(key, OK, f"The experience store {url} is in the same directory on every GPU node ({len(gpu_nodes)}), where Ray may place the trainer.", "")


def token_finding(token_path: str | None) -> Finding:
    from rftstack.doctor import cluster_net

    problem = cluster_net.token_problem(Path(token_path) if token_path else None)
    if problem:
        return Finding("cluster.token", FAIL, problem[0].upper() + problem[1:] + ".", "Give the doctor the head's token with --ray-token-path.")
    return Finding("cluster.token", OK, f"The token file {token_path} is present and private (mode 600).", "", {"path": token_path})


def check(address: str, nodes: list[dict] | None, why: str, token_path: str | None, paths: dict[str, str] | None = None,
          markers: dict[str, list[str]] | None = None, store: str | None = None) -> list[Finding]:  # fmt: skip
    out = [token_finding(token_path)]
    if nodes is None:
        out.append(Finding("cluster.nodes", FAIL, f"The Ray cluster at {address} did not answer a driver ({why}).",
                           "Check the address and the token (`rftstack ray-head status` on the head).", {"address": address}))  # fmt: skip
        return out
    alive = [n for n in nodes if n["alive"]]
    per_node = {n["ip"]: n["gpus"] for n in alive}
    out.append(Finding("cluster.nodes", OK if alive else FAIL,
                       f"The Ray cluster at {address} has {len(alive)} live node(s), {sum(per_node.values()):g} GPU(s): {per_node}.",
                       "" if alive else "Start the head and the workers.", {"address": address, "gpus_per_node": per_node}))  # fmt: skip
    for n in nodes:
        out.extend(node_findings(n))
    out.append(skew_finding(alive))
    out.extend(paths_findings(nodes, paths or {}, markers, store))
    return out
