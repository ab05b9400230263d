"""Runs Trinity's REAL proxy app (`trinity.explorer.proxy.app`) in this process, in front of an
upstream URL, with Trinity's real `HistoryRecorder` (SQLite) and `ExplorerService`'s own
`record_experience` / `record_feedback` / `submit_experiences` code.

What stands in (a TEST DOUBLE, the Explorer needs GPU engines and Ray actors): the Explorer object
the service talks to. Its `rollout_coordinator.process_experiences.remote(...)` writes every
committed experience as one JSON line to ``--commits`` (what /commit delivers) and, with
``--buffer DB``, also to an SQLite experience buffer through Trinity's real SQLExperienceStorage
(the storage behind the SQL buffer writer of a serve), which ``explorer.config`` names as
``buffer.trainer_input.experience_buffer``; its monitor drops metrics.

``--kill-in-commit before-write|after-write`` is the fault point of the crash tests: the process
SIGKILLs itself inside /commit, right before or right after that write (so between the
ExplorerService's marks of the rows and the experience buffer's write).

``--held``: a proxy started ahead of its turn (the crash tests' next process, while the one before it
runs): it imports Trinity, then waits for its port as one line on stdin before it opens its store and
serves (no line: the test is gone, it exits).

``--trinity-site DIR`` puts DIR first on sys.path so a patched copy of the trinity package there is
the one imported (the shared venv is never modified). ``--trace`` prints each record_experience
start, end and any exception, BaseException included (CancelledError is not an Exception), to
stderr: the evidence for what Trinity's ``except Exception: pass`` would hide.

    python tests/doubles/trinity_proxy_host.py --upstream URL (--port P | --held) --db FILE --commits FILE [--buffer FILE]
        [--kill-in-commit before-write|after-write] [--trinity-site DIR] [--trace]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import traceback
from types import SimpleNamespace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument("--held", action="store_true")
    ap.add_argument("--db", required=True)
    ap.add_argument("--commits", required=True)
    ap.add_argument("--buffer")
    ap.add_argument("--kill-in-commit", choices=["before-write", "after-write"])
    ap.add_argument("--trinity-site")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args(argv)
    if a.trinity_site:
        sys.path.insert(0, a.trinity_site)

    from trinity.common.experience import Experience
    from trinity.explorer.proxy import app as proxy_app
    from trinity.explorer.proxy import recorder as recorder_module
    from trinity.explorer.proxy.recorder import HistoryRecorder
    from trinity.explorer.proxy.service import ExplorerService

    print(f"TRINITY_APP {proxy_app.__file__}", file=sys.stderr, flush=True)
    if a.buffer:
        from trinity.buffer.storage.sql import SQLExperienceStorage
        from trinity.common.config import StorageConfig
    if a.held:
        line = sys.stdin.readline()
        if not line:
            return 1
        a.port = int(line)

    storage_cfg, storage = None, None
    if a.buffer:
        storage_cfg = StorageConfig(name="experience_buffer", storage_type="sql", path=f"sqlite:///{a.buffer}", schema_type="experience")
        storage = SQLExperienceStorage(storage_cfg)

    def fault(point: str) -> None:
        if a.kill_in_commit == point:
            print(f"KILL {point}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    class CoordinatorStandIn:
        class process_experiences:  # noqa: N801 - mirrors the Ray actor method's shape
            @staticmethod
            async def remote(batches: list[bytes]) -> dict:
                exps = [e for b in batches for e in Experience.deserialize_many(b)]
                fault("before-write")
                if storage is not None:
                    await storage.write(exps)
                with open(a.commits, "a") as f:
                    for e in exps:
                        n_prompt = e.prompt_length
                        f.write(json.dumps({"msg_id": e.eid.suffix, "reward": e.reward, "task": e.eid.task,
                                            "prompt_token_ids": e.tokens[:n_prompt].tolist(),
                                            "token_ids": e.tokens[n_prompt:].tolist(),
                                            "logprobs": [round(x, 6) for x in e.logprobs.tolist()],
                                            "model_version": e.info.get("model_version")}) + "\n")
                fault("after-write")
                return {"committed": len(exps)}

    class ExplorerStandIn:
        explore_step_num = 0
        rollout_coordinator = CoordinatorStandIn()
        config = SimpleNamespace(buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=storage_cfg)))

        class monitor:  # noqa: N801
            @staticmethod
            def log(metrics, step):
                pass

    class Service:
        """The attributes app.py and ExplorerService's methods use; the methods are Trinity's own."""

        record_feedback = ExplorerService.record_feedback
        # the policy's commit-marks patch: ExplorerService.serve() queues rows a dead process
        # rewarded but never committed; absent from unpatched Trinity
        restore_uncommitted = getattr(ExplorerService, "restore_uncommitted", None)
        submit_experiences = ExplorerService.submit_experiences
        collect_metrics = ExplorerService.collect_metrics
        _record = ExplorerService.record_experience

        def __init__(self) -> None:
            import logging

            self.logger = logging.getLogger("trinity_proxy_host")
            self.explorer = ExplorerStandIn()
            self.models = []
            self.total_experience_count = 0
            self.ready_experience_count = 0
            self.commit_lock = asyncio.Lock()
            from collections import deque

            self.ready_experiences = deque()
            self.recorder = HistoryRecorder(db_url=f"sqlite:///{a.db}", table_name="proxy_history")

        async def allocate_model(self, increase_count: bool = True):
            return a.upstream, 0

        async def record_experience(self, response, model_version):
            if not a.trace:
                return await self._record(response, model_version)
            rid = response.get("id")
            print(f"RECORD start {rid}", file=sys.stderr, flush=True)
            try:
                await self._record(response, model_version)
            except BaseException as e:
                print(f"RECORD raised {rid} {type(e).__module__}.{type(e).__qualname__}: {e!r}", file=sys.stderr, flush=True)
                traceback.print_exc()
                raise
            print(f"RECORD done {rid}", file=sys.stderr, flush=True)

    service = Service()
    proxy_app.app.state.service = service
    proxy_app.app.state.temperature = 0.0
    proxy_app.app.state.inference_timeout = 60

    async def serve() -> None:  # as ExplorerService.serve() then Trinity's run_app do it
        start_builders = getattr(recorder_module, "start_builders", None)  # patches/trinity-proxy-build-processes.patch
        # as the policy's app.py does when its lifespan begins (app.py may be the original here); the test
        # helper waits for as many builders as this line says (none: this trinity lacks the patch)
        pool = start_builders(service) if start_builders is not None else None
        print(f"BUILDERS {len(pool.builders) if pool is not None else 'none'}", file=sys.stderr, flush=True)
        if service.restore_uncommitted is not None:
            print(f"RESTORED {await service.restore_uncommitted()}", file=sys.stderr, flush=True)
        await proxy_app.serve_http(proxy_app.app, "127.0.0.1", a.port)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
