"""`rftstack doctor`: find, in seconds and without starting Ray or vLLM, each known way this stack
breaks on a server, and say in one sentence what is wrong and how to fix it.

The checks live in ``rftstack.doctor.checks.*`` (pure decisions over facts their readers gather); this
module reads the facts once, runs the checks in order and prints the findings. Nothing heavy is
imported here: torch, vllm, ray and trinity stay out of this process (the config check runs
Trinity's own validation in a subprocess, the one slow step, only with ``-c``).

`rftstack serve` calls :func:`collect` first and refuses to start on a failure.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from rftstack import dotted
from rftstack import findings as F
from rftstack.errors import UserError
from rftstack.findings import FAIL, Finding

if TYPE_CHECKING:
    from rftstack.doctor.checks import config as config_probe

# Check groups, in the order they run; --skip takes these names.
CHECKS: dict[str, str] = {
    "gpu": "NVIDIA driver, highest CUDA it runs, GPUs and their memory",
    "elf": "CUDA major of torch/vllm/flashinfer/nvidia binaries (ELF DT_NEEDED) against the driver",
    "toolchain": "ptxas (Triton) and nvcc (FlashInfer JIT) against the driver",
    "pyenv": "installed requirements (pip check) and source patches against the policy",
    "vllm-api": "the vLLM APIs Trinity's serve path needs (source read with ast)",
    "config": "-c CONFIG read, then validated by Trinity's own code in a subprocess",
    "rl-loop": "whether the served model can ever pick up a new checkpoint",
    "model": "model directory, architecture, tokenizer/chat template, weights vs GPU memory",
    "network": "proxy and Ray ports free; who can reach the proxy's listen address",
    "ray": "a running Ray cluster and whether it answers",
    "cluster": "with --ray-address: nodes, GPUs, driver against CUDA flavour per node, clock skew, token",
}
# The groups about this machine and its install, not about a config: a failure here means nothing
# can serve, so `collect(..., stop_at_machine_failure=True)` (serve's preflight) stops there.
MACHINE = ("gpu", "elf", "toolchain", "pyenv", "vllm-api")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


class _Run:
    """Runs one check group, turning a crash of the doctor itself into a finding (not a traceback)."""

    def __init__(self, skip: set[str]):
        self.skip = skip
        self.out: list[Finding] = []

    def __call__(self, name: str, fn: Callable[[], Iterable[Finding]]):
        if name in self.skip:
            return
        try:
            self.out.extend(fn())
        except Exception as exc:  # a bug in a check must not hide the other checks' findings
            self.out.append(Finding(name, FAIL, f"The doctor's {name} check crashed ({type(exc).__name__}: {exc}).",
                                    "Report this as an rftstack bug with `rftstack doctor --skip " + name + "` output attached."))


def collect(config_path: str | None = None, *, env=os.environ, gpu_reader=None, skip: Iterable[str] = (),
            progress: Callable[[str], None] | None = None, python: str | None = None,
            stop_at_machine_failure: bool = False, ray_address: str | None = None,
            ray_token_path: str | None = None, trinity_probe: "config_probe.Probe | None" = None) -> list[Finding]:
    """Every finding about this machine and, with ``config_path``, that config.

    ``stop_at_machine_failure``: return right after the machine groups (MACHINE) when one of them
    failed, so nothing slow (Trinity's config subprocess) runs for a machine that cannot serve.
    A config whose values fail (checks.values) is not handed to Trinity's subprocess either.

    ``gpu_reader``: a callable returning a ``checks.gpu.GpuInfo``; None reads the real driver (NVML,
    /proc, nvidia-smi). Tests pass a named test double here, the one thing not on a CPU machine.
    ``python``: the interpreter for Trinity's config subprocess (default: this one).
    ``ray_address``: a Ray cluster (with its token file) whose nodes are checked too (checks.cluster).
    ``trinity_probe``: Trinity's config subprocess started earlier by the caller (serve, beside its
    other steps); its result is used when it checked ``config_path`` as this run would, else a new
    one runs. The caller stops it when it is not used.
    """
    from rftstack.doctor import netstat
    from rftstack.stack import policy as policy_mod
    from rftstack.doctor.checks import config as config_check
    from rftstack.doctor.checks import elf, gpu, model, network, policy_patches, pyenv, ray_cluster, rlloop, toolchain, values, vllm_api

    skip = set(skip)
    unknown = skip - set(CHECKS)
    if unknown:
        raise UserError(f"unknown check {', '.join(sorted(unknown))}; choose from {', '.join(CHECKS)}")
    say = progress or (lambda msg: None)
    env = dict(env)
    run = _Run(skip)

    info = (gpu_reader or gpu.read)()
    max_cuda = info.max_cuda
    try:
        policy = policy_mod.load(env.get("RFTSTACK_POLICY"))
    except policy_mod.PolicyError as exc:
        policy = None
        run.out.append(Finding("policy", FAIL, str(exc), "Reinstall rftstack."))
    vllm_version = _version("vllm") or "?"

    run("gpu", lambda: gpu.check(info))
    run("elf", lambda: elf.check(elf.scan(), max_cuda, info.driver_version, policy))
    run("toolchain", lambda: toolchain.check(
        toolchain.find_ptxas(env, blackwell=bool(info.gpus and info.gpus[0].compute_capability and info.gpus[0].compute_capability >= (10, 0))),
        toolchain.find_nvcc(env), max_cuda, env))
    if policy is not None:
        run("pyenv", lambda: pyenv.check(pyenv.installed(), policy, **pyenv.context()))
        run("pyenv", lambda: policy_patches.check(policy_patches.plans(policy), policy))
    vllm_root = vllm_api.package_dir("vllm")
    trinity_root = vllm_api.package_dir("trinity")
    run("vllm-api", lambda: vllm_api.check(trinity_root, vllm_root, vllm_version))
    if stop_at_machine_failure and any(f.status == FAIL for f in run.out):
        return run.out

    raw = None
    if config_path is not None:
        if "config" in skip:
            try:
                raw = config_check.load_yaml(config_path)
            except config_check.ConfigFileError as exc:
                run.out.append(Finding("config.file", FAIL, exc.problem, exc.fix))
        else:
            raw, file_findings = config_check.check_file(config_path)
            run.out.extend(file_findings)
            value_failed = False
            if raw is not None:
                before = len(run.out)
                run("config", lambda: values.check(
                    raw, gpus_present=len(info.gpus) if info.driver_version else None,
                    model_max_len=config_check.max_position_embeddings(config_check.read_model_config(config_check.model_path(raw))),
                    engine_args=values.engine_arg_names(vllm_root)))
                value_failed = any(f.status == FAIL for f in run.out[before:])
                if value_failed:
                    run.out.append(Finding("config.trinity", F.INFO, "Trinity's own config check did not run: fix the values above first.", ""))
            if raw is not None and not value_failed:
                mpath = config_check.model_path(raw)
                gpus = max(1, len(info.gpus))
                fixed = config_check.cluster_sizes_fixed(raw)
                early = trinity_probe if trinity_probe is not None and trinity_probe.matches(config_path, gpus, fixed) else None
                if early is None:
                    say("checking the config with Trinity's own code (a subprocess that imports torch/ray/verl, about 15 s)...")
                else:
                    say(f"checking the config with Trinity's own code (its subprocess started {time.monotonic() - early.t0:.1f} s ago)...")
                run("config", lambda: config_check.check_trinity(
                    early.result() if early is not None else config_check.run_probe(config_path, gpus, python=python),
                    raw, config_check.read_model_config(mpath), config_path))
    if raw is not None:
        get = dotted.get

        def number(key: str, default, ok=values.is_num):
            """The config's value, or the default where it is of the wrong type (config.value said so)."""
            v = get(raw, key, default)
            return v if ok(v) else default

        run("rl-loop", lambda: rlloop.check(
            number("explorer.rollout_model.engine_num", rlloop.DEFAULT_ENGINE_NUM, values.is_int),
            number("explorer.min_running_model_num", rlloop.DEFAULT_MIN_RUNNING, values.is_int),
            dotted.is_set(raw, "explorer.min_running_model_num"),
            rlloop.sync_gate((trinity_root / rlloop.SERVICE).read_text()) if trinity_root and (trinity_root / rlloop.SERVICE).is_file() else None,
            get(raw, "mode", "serve")))

        def model_findings():
            reg = vllm_root / model.REGISTRY if vllm_root else None
            return model.check(
                config_check.model_path(raw),
                registry_source=reg.read_text() if reg and reg.is_file() else None,
                vllm_version=vllm_version, gpu=info,
                gpu_memory_utilization=float(number("explorer.rollout_model.gpu_memory_utilization", 0.9)),
                max_model_len=None)  # against the model: config.value
        run("model", model_findings)

    cluster_address = ray_address
    ray_address, ray_source = ray_cluster.find_address({**env, "RAY_ADDRESS": cluster_address} if cluster_address else env)
    ray_ok = ray_cluster.reachable(ray_address) if ray_address and not ray_address.startswith("ray://") else (None, "")
    port = dotted.get(raw or {}, "explorer.proxy_port", network.DEFAULT_PROXY_PORT)
    run("network", lambda: network.check(
        port if values.is_int(port) else network.DEFAULT_PROXY_PORT,
        str(dotted.get(raw or {}, "explorer.listen_address", network.DEFAULT_LISTEN)),
        netstat.listeners(),
        ray_address if ray_ok[0] else None,
        listen_is_default=not dotted.is_set(raw or {}, "explorer.listen_address")))
    run("ray", lambda: ray_cluster.check(ray_address, ray_source, ray_ok[0], ray_ok[1]))
    if cluster_address is not None:
        from rftstack.doctor import cluster_net
        from rftstack.doctor.checks import cluster

        def cluster_findings():
            say(f"asking every node of the Ray cluster at {cluster_address} to describe itself (a Ray driver, seconds)...")
            token = str(Path(ray_token_path).absolute()) if ray_token_path else ""
            paths, shared = {}, {}
            store = None
            if raw is not None:
                for name, key in (("model", "model.model_path"), ("checkpoints", "checkpoint_root_dir")):
                    value = dotted.get(raw, key, None)
                    if isinstance(value, str) and value:
                        paths[name] = str(Path(value).absolute())
                if "checkpoints" in paths:
                    shared["checkpoints"] = paths["checkpoints"]
                if dotted.get(raw, "mode", None) == "train":  # the trainer reads the store where Ray places it
                    store = dotted.get(raw, "buffer.trainer_input.experience_buffer.path", None)
                    if cluster.store_file(store):
                        shared["store"] = str(Path(cluster.store_file(store)).absolute().parent)
            markers = cluster.place_markers(shared)
            try:
                nodes, why = cluster.report(cluster_address, {**env, **cluster_net.client_env(cluster_address, token)}, paths, markers=markers)
            finally:
                cluster.remove_markers(markers)
            return cluster.check(cluster_address, nodes, why, ray_token_path, paths, markers, store)

        run("cluster", cluster_findings)
    return run.out


def summary(found: list[Finding]) -> str:
    counts = {s: sum(1 for f in found if f.status == s) for s in (F.OK, F.INFO, F.WARN, FAIL)}
    verdict = "the stack cannot serve here until the failures are fixed" if counts[FAIL] else "nothing blocks serving"
    return f"{counts[F.OK]} ok, {counts[F.INFO]} info, {counts[F.WARN]} warnings, {counts[FAIL]} failures: {verdict}."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", metavar="CONFIG", help="Trinity YAML to check (also validated by Trinity itself, ~15 s)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--skip", metavar="CHECK", action="append", default=[], choices=list(CHECKS),
                        help="skip a check group (repeatable): " + ", ".join(CHECKS))
    parser.add_argument("--ray-address", metavar="HEAD:PORT", default=None, help="also check this Ray cluster's nodes (with --ray-token-path)")
    parser.add_argument("--ray-token-path", metavar="FILE", default=None, help="the cluster's token file (the head's auth_token or a copy)")


def run(args) -> int:
    def progress(msg):
        print(f"rftstack doctor: {msg}", file=sys.stderr, flush=True)

    found = collect(args.config, skip=set(args.skip), progress=progress, ray_address=args.ray_address, ray_token_path=args.ray_token_path)
    if args.json:
        print(F.to_json(found, command="doctor", config=args.config))
    else:
        print(F.render(found))
        print(summary(found))
    return F.exit_code(found)
