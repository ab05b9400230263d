"""patches/trinity-engine-anyio-root.patch: in Trinity's engine actor (a Ray async actor, whose loop runs with
run_forever() in a thread) the API server's task is anyio's root task, so the worker threads anyio starts for sync
functions (vLLM's load tracking runs decrement_server_load after every response) are kept and reused, as under
`vllm serve`'s uvloop.run(); RFTSTACK_ENGINE_ANYIO_ROOT=0 gives upstream's new thread for most responses back; another
value stops the module's import (so the engine's API server) with one sentence.

Real: a Ray async actor on the session's loopback Ray head, the installed Trinity's run_server_worker_in_ray (with the
policy's patches, `rftstack relax`), vLLM's serve_http (uvicorn) and load_aware_call, Starlette and anyio as locked,
HTTP requests at concurrency 4; and the same server in a plain process on uvloop.run(), as `vllm serve` runs its own.
What stands in (TEST DOUBLES, an engine needs a GPU): vLLM's app and its state and
the engine client (bench/anyio_root_probe.py, run by bench/anyio_root.py's run_probe). What the patch is worth under load on the GPU host is
bench/anyio_root.py's and tests/gpu/host_session.sh's part (docs/benchmarks.md section 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import anyio_root
from rftstack.stack import patches
from rftstack.stack import policy

REL = "trinity/common/models/vllm_patch/api_patch_v17.py"
REQUESTS = 96  # at 48 upstream once started 26 threads to the plain server's 9 on CI (2.9x); at 96 55-59 to 8-9 here


def probe(head, switch: str, plain: bool = False) -> dict:
    r = anyio_root.run_probe(head, switch, REQUESTS, 4, timeout=300, plain=plain)
    assert "stderr" not in r, r["stderr"]  # the probe printed its JSON line
    return r


@pytest.fixture(scope="module")
def runs(session_head) -> dict:
    return {**{switch: probe(session_head, switch) for switch in ("-", "0", "yes")},
            "plain": probe(session_head, "0", plain=True)}


def test_by_default_the_worker_threads_are_reused(runs):
    r = runs["-"]
    assert r["rc"] == 0 and r["switch"] is True and r["answered"] == REQUESTS and r["load"] == 0
    # at concurrency 4 a few (a response's background task runs after it went out, so a few more than 4 overlap),
    # where upstream starts one for each
    assert r["calls"] > REQUESTS and r["threads"] <= REQUESTS // 4, r


def test_switched_off_most_responses_start_a_thread_of_their_own_as_upstream(runs):
    """Upstream's root is each request's own task: a new thread unless an idle one, whose request is still running,
    is at hand; it stops with its request."""
    r = runs["0"]
    assert r["rc"] == 0 and r["switch"] is False and r["answered"] == REQUESTS and r["load"] == 0
    assert r["threads"] >= r["calls"] // 2 and r["threads"] >= 3 * runs["-"]["threads"], (r, runs["-"])


def test_upstream_in_a_plain_process_on_uvloop_run_reuses_its_threads_as_the_patch_makes_the_actor_do(runs):
    """The premise of the patch: the same upstream code, in a process of its own on uvloop.run()'s loop as `vllm serve`
    runs its server, finds its root task and keeps its worker threads."""
    r = runs["plain"]
    assert r["rc"] == 0 and r["server"] == "plain" and r["switch"] is False and r["answered"] == REQUESTS, r
    assert r["load"] == 0 and r["calls"] > REQUESTS and r["threads"] <= REQUESTS // 4, r
    assert runs["0"]["threads"] >= 3 * r["threads"], (runs["0"], r)


def test_a_bad_value_stops_the_engines_server_with_one_sentence(runs):
    r = runs["yes"]
    assert r["rc"] == 1 and "RFTSTACK_ENGINE_ANYIO_ROOT must be 1" in r["error"] and "not 'yes'" in r["error"], r


def test_the_patch_is_the_policys_and_touches_only_the_server_start():
    import trinity

    (p,) = [p for p in policy.load().patches if p.file == "trinity-engine-anyio-root.patch"]
    installed = (Path(trinity.__file__).parents[1] / REL).read_text()
    published = patches.undo(installed, patches.patches_dir() / p.file, REL)
    assert "anchor_anyio_root_task" in installed and "anchor_anyio_root_task" not in published
    start = installed.split("async def run_server_worker_in_ray(", 1)[1].split("\nasync def ", 1)[0]
    assert start.index("anchor_anyio_root_task(asyncio.current_task())") < start.index("await serve_http(")


def test_anyio_as_locked_has_the_names_the_patch_sets():
    """With another anyio the patch does nothing (upstream behaviour): this fails first if the lock moves anyio."""
    from anyio._backends._asyncio import _root_task
    from anyio._backends._asyncio import find_root_task
    from anyio.lowlevel import _run_vars

    assert _root_task._name == "_root_task" and isinstance(_run_vars, object) and callable(find_root_task)
