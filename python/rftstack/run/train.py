"""`rftstack train`: preflight, a loopback Ray head, then `trinity run` in train mode, supervised.

The verl trainer reads the experiences a `rftstack serve` run committed (its SQLite store) and
writes a checkpoint after every step where that serve's synchronizer loads it (train_config.py).
Same shape as serve (serve.Serve: run directory, status.json, effective config with changes.json,
supervision, teardown on SIGINT/SIGTERM); what differs:

- the preflight adds the train-side checks (doctor/checks/trainside.py) and leaves out the serve-only
  ones (proxy port, engine reload, vLLM's share of GPU memory);
- there is no endpoint to wait for: phase ``training`` follows Trinity's log (``Training at step N
  finished``) and ``latest_state_dict_iteration.txt``;
- Trinity's trainer logs ``Error in Trainer`` and still exits 0 after a failed step: train exits 1,
  once Trinity saved its final checkpoint and stopped (up to --stop-timeout), and gives the failed
  step's batch back to the store (train_requeue.py), which the checkpoint would otherwise skip.

On one GPU the serve starts first (vLLM checks free memory at start; Trinity's trainer check only
total memory) and each side has its own Ray head: neither asks Ray for a fraction of a GPU.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import yaml

from rftstack.doctor.checks import trainside
from rftstack.run import ray_head, rundir, serve, serve_config, supervisor, train_config, train_requeue
from rftstack.errors import UserError

STEP_STARTED = re.compile(r"Training at step (\d+) started")
STEP_DONE = re.compile(r"Training at step (\d+) finished")
TRAINER_ERROR = "Error in Trainer"
NO_MORE = "No more samples to train"
SKIP_FOR_TRAIN = ("network", "rl-loop", "model", "ray")  # serve-only doctor groups


def latest_step(job_dir: str) -> int | None:
    """The step in the job dir's latest_state_dict_iteration.txt (what the serve loads), or None."""
    try:
        return int(Path(job_dir, "latest_state_dict_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None


class Train(serve.Serve):
    def __init__(self, args):
        super().__init__(args)
        self.tag = f"train-{uuid.uuid4().hex[:12]}"
        self.steps_done: list[int] = []
        self.trainer_errors: list[str] = []
        self.no_more_samples = False
        self.seen_step: int | None = None
        self.step_started: int | None = None
        self.failed_step: int | None = None  # the step whose training raised (see train_requeue.py)
        self.job: str | None = None
        self.store: dict = {}

    def _watch(self, line: str) -> None:
        """Trinity's log, line by line (the pump's thread): steps, errors."""
        m = STEP_STARTED.search(line)
        if m:
            self.step_started = int(m.group(1))
        m = STEP_DONE.search(line)
        if m:
            self.steps_done.append(int(m.group(1)))
        if TRAINER_ERROR in line:
            if not self.trainer_errors and self.step_started is not None and self.step_started not in self.steps_done:
                self.failed_step = self.step_started
            self.trainer_errors.append(line.strip())
        if NO_MORE in line:
            self.no_more_samples = True

    def _serve(self) -> tuple[str, int]:
        args = self.args
        self.run = rundir.create(args.run_dir, base=args.runs_base)
        self.serve_log = rundir.RotatingLog(self.run.log("train.log"))
        self.status = rundir.Status(self.run.status, run_dir=str(self.run.root), supervisor_pid=os.getpid(), tag=self.tag)
        self.say(f"run directory {self.run.root}")
        user_cfg, _ = self._user_config()
        if self._interrupted():
            return "stopped by signal", 0
        gpus = args.num_gpus if args.num_gpus is not None else ray_head.detect_gpus()
        gpus = max(int(gpus), 1)
        flash_attn = trainside.flash_attn_imports()
        pre, _ = train_config.effective(user_cfg, ray_address=args.ray_address or "auto", gpus=gpus, flash_attn=flash_attn)
        preflight = self.run.root / "config.preflight.yaml"
        rundir.write_atomic(preflight, yaml.safe_dump(pre, sort_keys=False))
        if args.ray_address:
            token = args.ray_token_path or os.environ.get("RAY_AUTH_TOKEN_PATH")
            if not token:
                raise UserError("--ray-address needs the head's token file; pass --ray-token-path or set RAY_AUTH_TOKEN_PATH")
            self._preflight_train(pre, str(preflight), flash_attn)
        else:
            with serve.HeadStarter(self, args.num_gpus) as starter:
                self._preflight_train(pre, str(preflight), flash_attn)
            self.head = starter.result()
        if self._interrupted():
            return "stopped by signal", 0

        self.phase("ray")
        if args.ray_address:
            ray_env = ray_head.client_env(args.ray_address, str(Path(token).absolute()))
            ray_address = args.ray_address
            self.say(f"joining the Ray head at {ray_address} (not started here, not stopped here)")
        else:
            (self.run.root / "ray").symlink_to(self.head.temp_dir)
            ray_env, ray_address = self.head.env(), self.head.address
            self.phase("ray", ray={"address": ray_address, "ports": self.head.ports, "tag": self.head.tag,
                                   "pids": [p.pid for p in self.head.processes()]})  # fmt: skip

        self.phase("config")
        cfg, changes = train_config.effective(user_cfg, ray_address=ray_address, gpus=gpus, flash_attn=flash_attn)
        rundir.write_atomic(self.run.config, yaml.safe_dump(cfg, sort_keys=False))
        rundir.write_atomic(self.run.changes, json.dumps([c.__dict__ for c in changes], indent=2, default=str) + "\n")
        self.say(f"effective config {self.run.config} ({len(changes)} change(s)):")
        for c in changes:
            self.say(f"  {c.render()}")
        env, notes = serve_config.environment(dict(os.environ), ray_env=ray_env, tag=self.tag, nvcc=serve.find_nvcc(dict(os.environ)))
        for n in notes:
            self.say(f"env: {n}")
        job = serve_config.job_dir(cfg)
        self.job, self.store = job, dict(serve_config.get(cfg, "buffer.trainer_input.experience_buffer") or {})
        data = {"checkpoint_job_dir": job, "experience_buffer": serve_config.get(cfg, "buffer.trainer_input.experience_buffer.path"),
                "latest": f"{job}/latest_state_dict_iteration.txt"}  # fmt: skip

        self.phase("trinity")
        argv = serve.trinity_command(dict(os.environ)) + ["run", "--config", str(self.run.config)]
        self.trinity_log = rundir.RotatingLog(self.run.log("trinity.log"))
        self.trinity_log.write(f"# {' '.join(argv)}")

        def sink(line: str) -> None:
            self.trinity_log.write(line)
            self._watch(line)

        self.trinity, self.pump = supervisor.spawn(argv, env=env, cwd=str(self.run.root), sink=sink)
        self.say(f"trinity started (pid {self.trinity.pid}): {' '.join(argv)}; log {self.run.log('trinity.log')}")
        for k, v in data.items():
            self.say(f"  data: {k} = {v}")
        self.phase("training", trinity_pid=self.trinity.pid, data=data)
        self.event("training", run_dir=str(self.run.root), data=data, status=str(self.run.status))

        self.seen_step = latest_step(job)
        failed_at: float | None = None
        while True:
            rc = self.trinity.poll()
            if rc is not None:
                self.pump.join(timeout=5)
                return self._finished(rc, job)
            if self.head is not None and self.head.gcs_pid() is None:
                return self._fail("the Ray head's GCS died")
            if self._interrupted():
                if self.trainer_errors:  # a signal while Trinity saves after the error: still a failed step
                    return self._fail(f"the trainer failed a step ({self.trainer_errors[0]}), then {self.signals[0]} stopped the wait; see {self.run.log('trinity.log')}")
                return f"stopped by {self.signals[0]}", 0
            self._note_checkpoint(job)
            if self.trainer_errors:  # Trinity saves a final checkpoint, then exits: let it, for a while
                if failed_at is None:
                    failed_at = time.monotonic()
                    self.say(f"the trainer failed a step: waiting up to {args.stop_timeout:.0f} s for Trinity's final checkpoint and exit")
                elif time.monotonic() - failed_at > args.stop_timeout:
                    return self._fail(f"the trainer failed a step ({self.trainer_errors[0]}); see {self.run.log('trinity.log')}")
            time.sleep(0.5)

    def _note_checkpoint(self, job: str) -> None:
        step = latest_step(job)
        if step is not None and step != self.seen_step:
            self.seen_step = step
            self.say(f"checkpoint of step {step} written: {job}/global_step_{step} (the serve loads it)")
            self.phase("training", latest_step=step, steps_done=len(self.steps_done))
            self.event("checkpoint", step=step)

    def _finished(self, rc: int, job: str) -> tuple[str, int]:
        self._note_checkpoint(job)
        step = latest_step(job)
        if self.trainer_errors:
            return self._fail(f"the trainer failed a step ({self.trainer_errors[0]}) and trinity exited with code {rc}; see {self.run.log('trinity.log')}")
        if rc != 0:
            return self._fail(f"trinity exited with code {rc}")
        why = "no full batch arrived within the reader's max_read_timeout" if self.no_more_samples else "total_steps reached"
        return f"training finished after {len(self.steps_done)} step(s), latest checkpoint step {step} ({why})", 0

    def _teardown(self) -> bool:
        """Stop trinity and Ray; then, after a trainer error, give the failed step's batch back."""
        clean = super()._teardown()
        if self.trainer_errors and self.job is not None:
            done = train_requeue.settle(self.failed_step, self.job, self.store)
            self.say(done.note)
            self.phase("stopping", gave_back={"step": done.step, "experiences": done.experiences, "store": done.store, "note": done.note})
            self.event("gave_back", step=done.step, experiences=done.experiences, store=done.store, note=done.note)
        return clean

    def _preflight_train(self, cfg: dict, config_path: str, flash_attn: bool) -> None:
        self.phase("preflight")
        if self.args.skip_doctor:
            self.say("preflight skipped (--skip-doctor)")
            return
        from rftstack.doctor.checks import gpu
        from rftstack.doctor.collect import collect
        from rftstack.findings import FAIL, render

        self.say("preflight: rftstack doctor (train side)")
        # with --ray-address: the cluster's nodes too, and whether the GPU nodes (where Ray places the
        # trainer) share the model, the checkpoint root and the experience store (checks/cluster.py)
        token = self.args.ray_token_path or os.environ.get("RAY_AUTH_TOKEN_PATH")
        found = collect(config_path, skip=SKIP_FOR_TRAIN, progress=lambda m: self.say(f"  {m}"),
                        ray_address=self.args.ray_address, ray_token_path=token if self.args.ray_address else None)  # fmt: skip
        self.say("  importing Trinity's verl trainer in a subprocess...")
        found += trainside.check_trainer_import(*trainside.trainer_import())
        found += trainside.check_attention(train_config.attn_implementation(cfg), flash_attn)
        buf = serve_config.get(cfg, "buffer.trainer_input.experience_buffer") or {}
        db = Path(str(buf.get("path", "")).removeprefix("sqlite:///"))
        found += trainside.check_store(db, buf.get("name") or "experience_buffer", *trainside.store_tables(db, buf.get("name") or "experience_buffer"))
        info = gpu.read()
        first = info.gpus[0] if info.gpus else None
        model = Path(str(serve_config.get(cfg, "model.model_path")))
        found += trainside.check_memory(trainside.count_params(model), bool(serve_config.get(cfg, "model.lora_configs")),
                                        first.free_mib if first else None, first.total_mib if first else None)  # fmt: skip
        text = render(found)
        for line in text.splitlines():
            self.say(f"  {line}")
        failed = [f for f in found if f.status == FAIL]
        if failed:
            raise UserError(f"preflight failed ({len(failed)} check(s): {', '.join(f.check for f in failed)}); fix them or pass --skip-doctor", 1)


def configure(parser) -> None:
    parser.add_argument("-c", "--config", required=True, help="trinity train config (YAML); write one with `rftstack example-config MODEL --train`")
    parser.add_argument("--run-dir", help="the run directory (must be new or empty); default ./rftstack-runs/<timestamp>")
    parser.add_argument("--runs-base", default=rundir.DEFAULT_BASE, help="where run directories are made (default ./rftstack-runs)")
    parser.add_argument("--ray-address", help="join this Ray head instead of starting one (it is not stopped at exit)")
    parser.add_argument("--ray-token-path", help="the token file of the head given by --ray-address")
    parser.add_argument("--num-gpus", type=int, default=None, help="GPUs for the Ray head and the trainer (default: detected)")
    parser.add_argument("--skip-doctor", action="store_true", help="skip the preflight checks (experts)")
    parser.add_argument("--stop-timeout", type=float, default=60.0, help="seconds trinity gets to stop before SIGKILL (default 60)")
    parser.add_argument("--json", action="store_true", help="JSON lines on stdout (events training/checkpoint/gave_back/exit); progress on stderr")


def run(args) -> int:
    return Train(args).main()
