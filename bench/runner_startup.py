#!/usr/bin/env python3
"""What `rftstack serve` itself adds to the time to ready, against the same steps by hand, on any machine.

Usage:
    PYTHONPATH=python python bench/runner_startup.py --out DIR [--rounds 3] [--phases runner,manual]

Trinity needs a GPU, so both sides run the TEST DOUBLE `tests/doubles/fake_trinity.py` in its place
(mode `check_ray`: it imports ray and connects a driver to the head, as `trinity run` does first, then
answers /health and /v1/models at once). What is left is the runner's own time:

  runner       `rftstack serve -c CONFIG --port P` (own loopback Ray head, the full preflight: the
               doctor's machine checks, then the config checks; the head and Trinity's real config
               check subprocess start at once, beside the machine checks);
               without an NVIDIA driver the doctor's GPU reader is the TEST DOUBLE
               `tests/doubles/h200_driver.py` (an H200 host), so the preflight passes and is timed
  manual       the report's steps by hand, as `bench/serve_vs_bare.py`'s manual phase runs them:
               `ray start --head` (loopback, no dashboard) then `trinity run` (the double)
  manual-dash  the same with Ray's dashboard (as `rftstack serve --dashboard`'s head has it)
  runner-baseline  `runner` from another source tree (--baseline-src: e.g. an earlier commit's
               `git archive COMMIT python | tar -x -C DIR`), for a before/after in the same run

Each round runs every phase once, one after another (the order alternates between rounds, so
that a change in the machine's load hits both sides alike); one warm-up round first is not counted
(bytecode, page cache). Time to ready: from the start of the first command to the first 200 from
/v1/models with a model (polled every 0.05 s); for the runner also to its `ready` event (the
endpoint printed). The runner's own progress lines (`[  12.3s] ...`) give its phases.

Nothing is asserted (speed is reported, not tested); the JSON in DIR holds every round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_TRINITY = ROOT / "tests" / "doubles" / "fake_trinity.py"
DRIVER_DOUBLE = ROOT / "tests" / "doubles" / "h200_driver.py"
PHASES = ("runner", "manual", "manual-dash", "runner-baseline")
STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)s\] (.*)$")
# the runner's progress lines that mark a step (first match wins), in the order they happen
MARKS = {
    "machine_checks": r"^preflight: rftstack doctor \(this machine\)",
    "config_checks": r"^preflight: rftstack doctor \(the config\)",
    "head_starting": r"^starting Ray head",
    "head_up": r"^Ray head processes up",
    "head_answers": r"^Ray head answers",
    "config_written": r"^effective config ",
    "trinity_started": r"^trinity started \(pid",
    "ready": r"^READY after",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_driver() -> bool:
    return bool(shutil.which("nvidia-smi")) or os.path.exists("/proc/driver/nvidia/version")


def marks(lines: list[str]) -> dict[str, float]:
    """Offsets (s, the runner's own clock) of the MARKS found in its progress lines."""
    found: dict[str, float] = {}
    for line in lines:
        m = STAMP.match(line.strip())
        if not m:
            continue
        for key, pattern in MARKS.items():
            if key not in found and re.search(pattern, m.group(2)):
                found[key] = float(m.group(1))
    return found


def summary(rounds: list[dict], phases: list[str]) -> dict:
    """Median time to ready per phase, and per round the runner's excess over each manual phase."""
    out: dict = {"phases": {}, "runner_minus": {}, "runner_ratio": {}}
    for ph in phases:
        vals = [r[ph]["ready_s"] for r in rounds if r.get(ph, {}).get("ready_s") is not None]
        out["phases"][ph] = {"median_ready_s": round(statistics.median(vals), 2) if vals else None, "n": len(vals),
                             "all": vals}  # fmt: skip
    if "runner" in phases:
        for ph in phases:
            if ph == "runner":
                continue
            pairs = [(r["runner"]["ready_s"], r[ph]["ready_s"]) for r in rounds
                     if r.get("runner", {}).get("ready_s") is not None and r.get(ph, {}).get("ready_s") is not None]  # fmt: skip
            if pairs:
                out["runner_minus"][ph] = round(statistics.median(a - b for a, b in pairs), 2)
                out["runner_ratio"][ph] = round(statistics.median(a / b for a, b in pairs), 3)
    for ph in phases:
        if not ph.startswith("runner"):
            continue
        steps = [r[ph].get("marks", {}) for r in rounds if r.get(ph, {}).get("marks")]
        keys = [k for k in MARKS if any(k in s for s in steps)]
        out[f"{ph}_marks_median".replace("-", "_")] = {k: round(statistics.median(s[k] for s in steps if k in s), 2) for k in keys}
    return out


class Proc:
    """A child whose stdout+stderr lines are kept (read in a thread)."""

    def __init__(self, argv: list[str], env: dict, log: Path):
        self.log = open(log, "w")
        self.p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)  # fmt: skip
        self.lines: list[str] = []
        self.events: dict[str, float] = {}
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            if line.startswith('{"event": "ready"'):
                self.events["ready"] = time.monotonic()

    def stop(self, timeout: float = 60) -> int | None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGINT)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.t.join(timeout=5)
        self.log.close()
        return self.p.returncode


def wait_ready(url: str, proc: Proc, t0: float, timeout: float) -> float | None:
    while time.monotonic() - t0 < timeout:
        if proc.p.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("data"):
                    return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return None


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="runner-startup-"))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            self.env.pop(k, None)
        # RFTSTACK_WARM_WORKERS=0: the trinity test double starts no actors, so the head's warm workers
        # (which import Trinity's actor modules) would only load the machine the runner is timed on
        self.env.update(RFTSTACK_TRINITY_CMD=f"{sys.executable} {FAKE_TRINITY}", FAKE_TRINITY="check_ray",
                        XDG_CACHE_HOME=str(self.work / "cache"), RFTSTACK_WARM_WORKERS="0")  # fmt: skip
        self.model = Path(args.model) if args.model else self.work / "tiny"
        self.config = self.work / "serve.yaml"

    def prepare(self) -> None:
        if not self.args.model:
            subprocess.run([sys.executable, "-m", "rftstack", "tiny-model", str(self.model)], env=self.env, check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
        sys.path.insert(0, str(ROOT / "python"))
        import yaml

        from rftstack.run import serve_config

        cfg = serve_config.default_config(str(self.model), gpus=1)
        cfg["checkpoint_root_dir"] = str(self.work / "ckpt")
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def runner(self, name: str, src: Path = ROOT) -> dict:
        port = free_port()
        run_dir = self.work / f"{name}-run"
        shutil.rmtree(run_dir, ignore_errors=True)
        prefix = [sys.executable, str(DRIVER_DOUBLE)] if self.args.driver_double else [sys.executable, "-m", "rftstack"]
        argv = [*prefix, "serve", "--json", "-c", str(self.config), "--port", str(port), "--num-gpus", "1", "--run-dir", str(run_dir)]
        env = {**self.env, "PYTHONPATH": str(src / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.monotonic()
        p = Proc(argv, env, self.logs / f"{name}.log")
        ready = wait_ready(f"http://127.0.0.1:{port}/v1/models", p, t0, self.args.timeout)
        deadline = time.monotonic() + 30
        while ready is not None and "ready" not in p.events and time.monotonic() < deadline and p.p.poll() is None:
            time.sleep(0.01)
        r = {"ready_s": round(ready, 2) if ready is not None else None,
             "ready_event_s": round(p.events["ready"] - t0, 2) if "ready" in p.events else None}  # fmt: skip
        rc = p.stop()
        r.update(marks=marks(p.lines), exit=rc)
        if ready is None:
            r["tail"] = p.lines[-20:]
        return r

    def manual(self, name: str, dashboard: bool) -> dict:
        from rftstack.run import supervisor  # the head's processes carry its tag: stopped by it, never `ray stop`

        port, gcs = free_port(), free_port()
        tag = f"bench-manual-{uuid.uuid4().hex[:8]}"
        ray_dir = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))  # Ray's socket paths must stay short
        import yaml

        cfg = yaml.safe_load(self.config.read_text())
        cfg["explorer"] = {**cfg.get("explorer", {}), "listen_address": "127.0.0.1", "proxy_port": port}
        cfg["cluster"] = {**cfg.get("cluster", {}), "ray_address": f"127.0.0.1:{gcs}"}
        cfg_path = self.work / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray keeps 127.0.0.1 as the node address instead of the
        # host's (which a sandboxed machine may not reach from itself); it changes no start-up step
        # RAY_AUTH_MODE=disabled: a plain head as the report started it (Ray 2.60 turns token auth on
        # by itself when ~/.ray/auth_token exists)
        env = {**self.env, supervisor.TAG_VAR: tag, "RAY_ADDRESS": f"127.0.0.1:{gcs}", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAY_AUTH_MODE": "disabled"}  # fmt: skip
        head = ["ray", "start", "--head", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--port={gcs}",
                f"--ray-client-server-port={free_port()}", "--num-gpus=1", "--disable-usage-stats", f"--temp-dir={ray_dir}"]  # fmt: skip
        head.append(f"--dashboard-port={free_port()}" if dashboard else "--include-dashboard=false")
        ray_bin = str(Path(sys.executable).with_name("ray"))
        t0 = time.monotonic()
        r: dict = {}
        try:
            with open(self.logs / f"{name}-ray-start.log", "w") as log:
                rc = subprocess.run([ray_bin, *head[1:]], env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300).returncode
            r["ray_start_s"] = round(time.monotonic() - t0, 2)
            if rc != 0:
                return {**r, "ready_s": None, "error": f"ray start exited {rc}"}
            p = Proc([*shlex.split(self.env["RFTSTACK_TRINITY_CMD"]), "run", "--config", str(cfg_path)], env,
                     self.logs / f"{name}-trinity.log")  # fmt: skip
            ready = wait_ready(f"http://127.0.0.1:{port}/v1/models", p, t0, self.args.timeout)
            r["ready_s"] = round(ready, 2) if ready is not None else None
            p.stop()
        finally:
            res = supervisor.stop(tag=tag, first=signal.SIGTERM, grace_s=5, term_s=0, kill_s=10)
            r["left"] = [x.pid for x in res.left]
            shutil.rmtree(ray_dir, ignore_errors=True)
        return r

    def phase(self, ph: str, rnd: int) -> dict:
        name = f"r{rnd}-{ph}"
        if ph == "runner":
            return self.runner(name)
        if ph == "runner-baseline":
            return self.runner(name, Path(self.args.baseline_src).resolve())
        return self.manual(name, dashboard=ph == "manual-dash")

    def run(self) -> int:
        phases = [p for p in self.args.phases.split(",") if p]
        bad = [p for p in phases if p not in PHASES]
        if bad:
            raise SystemExit(f"unknown phase {bad[0]}; choose from {', '.join(PHASES)}")
        if "runner-baseline" in phases and not (self.args.baseline_src and (Path(self.args.baseline_src) / "python" / "rftstack").is_dir()):
            raise SystemExit("the runner-baseline phase needs --baseline-src DIR with DIR/python/rftstack (an earlier source tree)")
        self.prepare()
        rounds: list[dict] = []
        for rnd in range(self.args.rounds + 1):
            order = phases if rnd % 2 == 0 else phases[::-1]
            res = {ph: self.phase(ph, rnd) for ph in order}
            line = ", ".join(f"{ph} {res[ph].get('ready_s')}" for ph in phases)
            print(f"round {rnd}{' (warm-up, not counted)' if rnd == 0 else ''}: {line}", file=sys.stderr, flush=True)
            if rnd > 0:
                rounds.append(res)
        result = {
            "command": " ".join(["python", "bench/runner_startup.py", *self.args.argv]),
            "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(), "driver_double": self.args.driver_double},
            "rounds": rounds,
            "summary": summary(rounds, phases),
        }
        (self.out / "runner-startup.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["summary"], indent=2))
        shutil.rmtree(self.work, ignore_errors=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for runner-startup.json and logs/")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds (one warm-up round runs first)")
    ap.add_argument("--phases", default="runner,manual", help=f"comma-separated, from {', '.join(PHASES)}")
    ap.add_argument("--baseline-src", help="a source tree holding python/rftstack, run as the runner-baseline phase")
    ap.add_argument("--model", help="a model directory (default: rftstack's tiny model, written once)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds each phase may take to get ready")
    ap.add_argument("--driver-double", action=argparse.BooleanOptionalAction, default=not has_driver(),
                    help="the doctor reads the TEST DOUBLE H200 driver (default: when this machine has no NVIDIA driver)")
    args = ap.parse_args(argv)
    args.argv = argv
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
