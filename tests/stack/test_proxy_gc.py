"""patches/trinity-proxy-gc.patch: when Trinity's proxy starts, the objects its process holds by then
are frozen for Python's garbage collector (a full collection no longer walks them); objects made later
are collected as before.
RFTSTACK_PROXY_GC=0 restores Python's collector as it comes.

Real: Trinity's installed proxy app (with the policy's patches, `rftstack relax`) and its lifespan,
run in a child process (the collector's state belongs to a process), as published (this patch
reversed from the installed app.py, into a private module) and patched with the switch at 1 and 0;
and Trinity's proxy host (tests/doubles/trinity_proxy_host.py) in front of the TEST DOUBLE vLLM
server of tests/proxy_helpers.py, whose responses are still recorded before they are returned.

The upstream behaviour this guards: as published, a full collection after the proxy's start walks
every object of the process's start (hundreds of thousands: torch, Trinity, FastAPI), which is what
stalled the proxy's event loop in a burst (docs/benchmarks.md, "The garbage collector").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rftstack.stack import policy

from patch_helpers import installed_without
from proxy_helpers import Proxy, assert_bad_switch_stops_the_proxy

VAR = "RFTSTACK_PROXY_GC"
REL = "trinity/explorer/proxy/app.py"

# Child: import the app (installed, or the private copy given), note what the collector tracks, run
# the app's lifespan as uvicorn does, then report the collector's state, the objects a full
# collection walks, the fastest of three full collections, and whether a cycle made after the start,
# and one made before it, are freed once unreachable.
PROBE = r"""
import asyncio, gc, importlib.util, json, sys, time, weakref
if sys.argv[1] == "-":
    from trinity.explorer.proxy import app as mod
else:
    spec = importlib.util.spec_from_file_location("app_as_published", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
before = len(gc.get_objects())
class Node: pass
old_a, old_b = Node(), Node(); old_a.other, old_b.other = old_b, old_a
old = weakref.ref(old_a)
async def start():
    async with mod.app.router.lifespan_context(mod.app):
        pass
asyncio.run(start())
walked = len(gc.get_objects())
times = []
for _ in range(3):
    t = time.perf_counter(); gc.collect(); times.append(time.perf_counter() - t)
a, b = Node(), Node(); a.other, b.other = b, a
gone = weakref.ref(a); del a, b, old_a, old_b
gc.collect()
print("PROBE " + json.dumps({"tracked_at_import": before, "walked": walked, "frozen": gc.get_freeze_count(),
      "threshold": gc.get_threshold(), "full_collection_s": min(times), "cycle_freed": gone() is None,
      "old_cycle_freed": old() is None}))
"""


def the_patch() -> policy.Patch:
    (p,) = [p for p in policy.load().patches if p.file == "trinity-proxy-gc.patch"]
    return p


@pytest.fixture(scope="module")
def published_app(tmp_path_factory) -> Path:
    """The installed app.py with this patch reversed (the other patches kept): Trinity as published here."""
    installed, path = installed_without(the_patch().file, REL, tmp_path_factory.mktemp("published"), "app_as_published.py")
    assert f'GC_VAR = "{VAR}"' in installed, "the installed Trinity lacks the gc patch: run `rftstack relax`"
    assert VAR not in path.read_text()
    return path


def probe(app: str, env_value: str | None, monkeypatch) -> dict:
    if env_value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, env_value)
    out = subprocess.run([sys.executable, "-c", PROBE, app], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):])


@pytest.fixture(scope="module")
def states(published_app) -> dict[str, dict]:
    """The collector after the proxy's start: as published, patched (default) and switched off."""
    with pytest.MonkeyPatch.context() as mp:
        return {"published": probe(str(published_app), None, mp), "patched": probe("-", None, mp),
                "off": probe("-", "0", mp)}


def test_as_published_a_full_collection_walks_every_object_of_the_start(states):
    pub = states["published"]
    assert pub["frozen"] == 0 and pub["threshold"][0] == 700  # Python's defaults
    assert pub["walked"] >= pub["tracked_at_import"] > 100_000  # torch, Trinity, FastAPI ... all walked
    assert states["off"]["frozen"] == 0 and states["off"]["threshold"] == pub["threshold"]
    assert states["off"]["walked"] >= states["off"]["tracked_at_import"] > 100_000


def test_patched_the_start_is_frozen_and_full_collections_are_short(states):
    pub, new = states["published"], states["patched"]
    assert new["frozen"] >= new["tracked_at_import"] * 0.9  # what the start left is frozen
    assert new["walked"] < new["tracked_at_import"] / 20  # a full collection walks a few thousand objects
    assert new["threshold"] == pub["threshold"]  # the collector's thresholds are Python's
    # the pause a full collection makes: timed in the same conditions, fastest of three
    assert new["full_collection_s"] < pub["full_collection_s"] / 5, (new["full_collection_s"], pub["full_collection_s"])


def test_garbage_made_after_the_start_is_still_collected(states):
    assert states["patched"]["cycle_freed"] is True
    assert states["published"]["cycle_freed"] is True


def test_a_cycle_of_the_start_that_becomes_garbage_later_is_not_freed(states):
    """The price of the freeze, as docs/serve.md states it; as published such a cycle is freed."""
    assert states["patched"]["old_cycle_freed"] is False
    assert states["published"]["old_cycle_freed"] is True and states["off"]["old_cycle_freed"] is True


def test_switch_values():
    from trinity.explorer.proxy import app

    assert app.GC_VAR == VAR, "the installed Trinity lacks the gc patch: run `rftstack relax`"
    assert app.gc_freeze_enabled({}) is True
    assert app.gc_freeze_enabled({VAR: "1"}) is True
    assert app.gc_freeze_enabled({VAR: " 0 "}) is False
    with pytest.raises(ValueError, match=f"{VAR} must be 1 .* or 0 .*not 'off'"):
        app.gc_freeze_enabled({VAR: "off"})


@pytest.mark.parametrize("value, says", [(None, "objects frozen for the garbage collector"), ("0", None)])
def test_the_proxy_says_so_and_records_every_response_before_returning_it(monkeypatch, tmp_path, double, value, says):
    """Trinity's proxy host with the switch unset and at 0: its log line, and each response recorded
    (its row in the store) by the time the client has it."""
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    px = Proxy(double.base_url, tmp_path / "proxy", None)
    try:
        for i in range(6):
            r = px.client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"gc {i}"}], max_tokens=4)
            assert r.id in px.rows()
        log = px.log.read_text()
        if says:
            assert f"{says} ({VAR}=1, rftstack patch)" in log
        else:
            assert "frozen for the garbage collector" not in log
    finally:
        px.stop()


def test_a_bad_value_stops_the_proxy_with_a_sentence(monkeypatch, tmp_path, double):
    assert_bad_switch_stops_the_proxy(monkeypatch, tmp_path / "proxy", double.base_url, VAR)
