"""Requests while the only engine reloads new weights (patches/trinity-proxy-reload-wait.patch).

Guards an upstream behaviour: with `explorer.min_running_model_num: 0` (what rftstack serve sets)
Trinity 0.6.0's weight-sync loop takes the engine out of `running_model_ids` while it reloads, and
`ExplorerService.allocate_model` indexed the empty deque: HTTP 500. The same scenario runs against
the original service.py (500) and the patched one (the request waits and succeeds; past
RFTSTACK_PROXY_RELOAD_WAIT_S it gets 503 with one sentence in OpenAI's error shape).

Real: Trinity's proxy app (app.py, served by uvicorn on a loopback port), ExplorerService's own
serve(), model_weights_sync_loop(), _sync_model_weights(), allocate_model() and record_experience()
(from a private copy of service.py, patched or not), its SQLite HistoryRecorder, httpx.
TEST DOUBLES: the vLLM engine (tests/doubles/vllm_stream_double.py upstream, and `EngineDouble` for
the ModelWrapper around it, whose reload is a sleep) and the Explorer object that owns them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from doubles.vllm_stream_double import MODEL_ID, VLLMStreamDouble
from rftstack.stack import patches, policy

httpx = pytest.importorskip("httpx")

REL = "trinity/explorer/proxy/service.py"
VAR = "RFTSTACK_PROXY_RELOAD_WAIT_S"
RELOAD_S = 1.5
CLIENTS = 4
SENTENCE = (
    "no model engine came back within 0.3 s (each was reloading new weights or had stopped), so this "
    "request was not served; retry it, raise RFTSTACK_PROXY_RELOAD_WAIT_S if reloads take longer, or "
    "see the explorer's log"
)


def the_patch():
    (p,) = [p for p in policy.load().patches if p.file == "trinity-proxy-reload-wait.patch"]
    return p


def load_service(patched: bool, tmp: Path):
    """Trinity's service.py as installed by the policy's earlier patches, with or without this one."""
    import trinity

    text = (Path(trinity.__file__).parents[1] / REL).read_text()
    (fp,) = patches.parse((patches.patches_dir() / the_patch().file).read_text())
    text = patches.undo(text, patches.patches_dir() / the_patch().file, REL)  # the file before this patch
    assert "RELOAD_WAIT_VAR" not in text
    if patched:
        text = patches.apply_text(text, fp)[0]
    name = f"service_reload_{'patched' if patched else 'orig'}"
    path = tmp / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class EngineDouble:
    """TEST DOUBLE of Trinity's ModelWrapper (a vLLM engine needs a GPU): the attributes and
    coroutines ExplorerService uses; a reload sleeps RELOAD_S and records when it ran."""

    def __init__(self, api_address: str) -> None:
        self.api_address = api_address
        self.request_count = 0
        self.status = None
        self.model_version = 0
        self.reloads: list[tuple[float, float]] = []

    @property
    def model_version_async(self):
        async def version() -> int:
            return self.model_version

        return version()

    async def get_current_load(self) -> int:
        return 0

    async def sync_model_weights(self, version: int, method) -> None:
        start = time.monotonic()
        await asyncio.sleep(RELOAD_S)
        self.model_version = version
        self.reloads.append((start, time.monotonic()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def explorer_double(engine: EngineDouble, db: Path) -> SimpleNamespace:
    """TEST DOUBLE of the Explorer: the config values and objects ExplorerService reads."""
    explorer_cfg = SimpleNamespace(min_running_model_num=0, service_status_check_interval=0.2, max_timeout=30, db_url=f"sqlite:///{db}")
    config = SimpleNamespace(explorer=explorer_cfg, buffer=SimpleNamespace(cache_dir=str(db.parent)),
                             model=SimpleNamespace(temperature=0.0), synchronizer=SimpleNamespace(sync_timeout=60))  # fmt: skip
    return SimpleNamespace(models=[engine], config=config, explore_step_num=0)


async def through_a_reload(service_mod, upstream: str, db: Path) -> dict:
    """Serve, reload to version 1 and send CLIENTS requests while the engine is out; then the same
    with a second reload. Returns what each request got and when the reloads ran."""
    engine = EngineDouble(upstream)
    port = free_port()
    service = service_mod.ExplorerService(explorer_double(engine, db), listen_address="127.0.0.1", port=port)
    await service.serve()
    out: dict = {"engine": engine, "rounds": []}
    chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        end = time.monotonic() + 30
        while True:  # the proxy is up once /health answers
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > end:
                    raise
            await asyncio.sleep(0.05)
        out["before"] = (await client.post("/v1/chat/completions", json=chat)).status_code
        for version in (1, 2):
            service.set_latest_model_version(version)
            end = time.monotonic() + 10
            while service.running_model_ids:  # the sync loop takes the engine out
                assert time.monotonic() < end, "the sync loop did not start a reload"
                await asyncio.sleep(0.01)
            sent = time.monotonic()

            async def one():
                r = await client.post("/v1/chat/completions", json=chat)
                return r.status_code, r.text, time.monotonic()

            got = await asyncio.gather(*(one() for _ in range(CLIENTS)))
            while not service.running_model_ids:
                await asyncio.sleep(0.01)
            out["rounds"].append({"sent": sent, "got": got})
        out["after"] = (await client.post("/v1/chat/completions", json=chat)).status_code
    await service.shutdown()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The patched service first (its serve() registers the 503 handler on Trinity's app before the
    app's first request), then the bound passing, then 0 (upstream behaviour), then the original."""
    import os

    out = {}
    mods = {patched: load_service(patched, tmp_path_factory.mktemp("mod")) for patched in (True, False)}  # one module each, as in a proxy
    with VLLMStreamDouble() as up:
        for label, patched, wait in (("patched", True, None), ("bound", True, "0.3"), ("zero", True, "0"), ("orig", False, None)):
            tmp = tmp_path_factory.mktemp(label)
            mod = mods[patched]
            old = os.environ.pop(VAR, None)
            if wait is not None:
                os.environ[VAR] = wait
            try:
                out[label] = asyncio.run(through_a_reload(mod, up.base_url, tmp / "proxy_history.db"))
            finally:
                os.environ.pop(VAR, None)
                if old is not None:
                    os.environ[VAR] = old
    return out


def test_original_service_answers_500_during_a_reload(runs):
    run = runs["orig"]
    assert run["before"] == 200 and run["after"] == 200
    for rnd in run["rounds"]:
        assert [code for code, _, _ in rnd["got"]] == [500] * CLIENTS
        assert all(text == "Internal Server Error" for _, text, _ in rnd["got"])


def test_patched_requests_wait_for_the_reload_and_succeed(runs):
    run = runs["patched"]
    assert run["before"] == 200 and run["after"] == 200
    assert run["engine"].model_version == 2 and len(run["engine"].reloads) == 2
    for rnd, (start, end) in zip(run["rounds"], run["engine"].reloads):
        assert [code for code, _, _ in rnd["got"]] == [200] * CLIENTS, rnd["got"]
        # each was answered after the reload ended, having waited through it
        assert all(done >= end for _, _, done in rnd["got"])
        assert end - rnd["sent"] > RELOAD_S / 2


def test_patched_wait_is_bounded_then_503_with_a_sentence(runs):
    import json

    run = runs["bound"]
    assert run["before"] == 200 and run["after"] == 200  # served again once the engine is back
    for rnd, (_, end) in zip(run["rounds"], run["engine"].reloads):
        for code, text, done in rnd["got"]:
            assert code == 503
            assert json.loads(text) == {"error": {"message": SENTENCE, "type": "service_unavailable", "code": 503}}
            assert 0.3 <= done - rnd["sent"] < RELOAD_S and done < end


def test_patched_zero_is_the_upstream_behaviour(runs):
    assert [code for rnd in runs["zero"]["rounds"] for code, _, _ in rnd["got"]] == [500] * 2 * CLIENTS


def test_patch_touches_service_py_only():
    assert [fp.path for fp in patches.parse((patches.patches_dir() / the_patch().file).read_text())] == [REL]
