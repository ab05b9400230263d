"""docs/benchmarks.md's session AD claims (2026-12-05, CPU, no GPU lent) are what bench/results/anyio-root-plain-cpu.json
holds: bench/anyio_root.py with the engine's API server in a Ray actor, the anyio-root patch on and off, and the same
server in a plain process on uvloop.run(), as `vllm serve` runs its own."""

from __future__ import annotations

import json
import statistics

from helpers import REPO
from helpers import doc_section

RESULT = REPO / "bench" / "results" / "anyio-root-plain-cpu.json"
HEADING = "### The patched server beside the same server in a plain process (session AD"
NAMES = {"on": "Ray actor, patch on (default)", "off": "Ray actor, patch off (upstream)",
         "plain": "plain process on `uvloop.run()` (upstream, as `vllm serve`)"}


def text() -> str:
    return " ".join(doc_section(HEADING).split())


def result() -> dict:
    return json.loads(RESULT.read_text())


def values(name: str, key: str) -> list:
    return [r[name][key] for r in result()["rounds"]]


def test_the_run_is_the_command_the_section_gives():
    r = result()
    assert r["command"].endswith("--rounds 6 --requests 2000 --concurrency 32") and r["machine"]["cpus"] == 2
    assert "bench/anyio_root.py --out bench/results/anyio-root-plain-cpu.json --rounds 6 --requests 2000 --concurrency 32" in text()
    orders = [tuple(x["order"]) for x in r["rounds"]]
    assert len(orders) == 6 and sorted(o[0] for o in orders) == ["off", "off", "on", "on", "plain", "plain"]
    for x in r["rounds"]:
        assert (x["on"]["server"], x["off"]["server"], x["plain"]["server"]) == ("ray-actor", "ray-actor", "plain")
        assert x["on"]["switch"] and not x["off"]["switch"] and not x["plain"]["switch"]
        assert all(x[n]["answered"] == 2000 and x[n]["load"] == 0 and x[n]["calls"] == 2001 for n in NAMES)


def test_the_table_is_the_result():
    t = text()
    for name, label in NAMES.items():
        rps, threads = values(name, "requests_per_s"), values(name, "threads")
        loop, proc = values(name, "loop_thread_ms_per_request"), values(name, "process_ms_per_request")
        work = values(name, "fixed_work_cpu_us")
        row = (f"| {label} | {statistics.median(rps):.0f} ({min(rps):.0f}-{max(rps):.0f}) | {min(threads)}-{max(threads)} "
               f"| {statistics.median(loop):.2f} ({min(loop):.2f}-{max(loop):.2f}) | {statistics.median(proc):.2f} "
               f"| {statistics.median(work):.0f} ({min(work):.0f}-{max(work):.0f}) |")
        assert row in t, row


def per_round(a: str, b: str, key: str) -> list[float]:
    return [x[a][key] / x[b][key] for x in result()["rounds"]]


def test_the_reading_is_the_result():
    r, t = result(), text()
    loop = {n: statistics.median(values(n, "loop_thread_ms_per_request")) for n in NAMES}
    proc = {n: statistics.median(values(n, "process_ms_per_request")) for n in NAMES}
    threads = {n: values(n, "threads") for n in NAMES}
    # upstream's code in a plain process keeps its threads, as the patched actor does; in the actor it does not
    assert max(threads["plain"]) <= 20 and max(threads["on"]) <= 20 and min(threads["off"]) > 1000
    assert f"{min(threads['plain'])}-{max(threads['plain'])} worker threads for 2001 background calls" in t
    assert f"as the patched actor's {min(threads['on'])}-{max(threads['on'])}" in t
    assert f"in the actor the same code started {min(threads['off'])}-{max(threads['off'])}" in t
    # the patched actor's server spends what the plain process's does; upstream in the actor more, in every round
    assert abs(loop["on"] - loop["plain"]) / loop["plain"] < 0.15 and loop["off"] / loop["on"] > 1.5
    off_on = per_round("off", "on", "loop_thread_ms_per_request")
    assert min(off_on) > 1.3
    assert (f"{loop['on']:.2f} against {loop['plain']:.2f} ms of its loop thread's CPU a request "
            f"({proc['on']:.2f} against {proc['plain']:.2f} ms of the whole process); upstream in the actor "
            f"{loop['off']:.2f} ({proc['off']:.2f}), {loop['off'] / loop['on']:.1f} times, in every round "
            f"({min(off_on):.2f}-{max(off_on):.2f} times the patched actor's)") in t
    for a, b in (("on", "off"), ("on", "plain"), ("off", "plain")):
        ratios = [x[f"ratio_{a}_{b}"] for x in r["rounds"]]
        assert r[f"median_ratio_{a}_{b}"] == statistics.median(ratios)
        assert f"{a} / {b} {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" in t


def test_the_fixed_work_reading_is_the_result():
    t = text()
    off_on = per_round("off", "on", "fixed_work_cpu_us")
    on_plain = per_round("on", "plain", "fixed_work_cpu_us")
    assert min(off_on) > 1 and max(off_on) < 2  # dearer in every round, not two to four times
    assert (f"more CPU under upstream's actor than under the patched one in every round ({min(off_on):.2f}-"
            f"{max(off_on):.2f} times, median {statistics.median(off_on):.2f}), against {min(on_plain):.2f}-"
            f"{max(on_plain):.2f} between the patched actor and the plain process") in t
    work = [w for n in NAMES for w in values(n, "fixed_work_cpu_us")]
    assert f"the same server's fixed work itself moved {min(work):.0f}-{max(work):.0f} us" in t


def test_it_says_what_it_does_not_measure_and_where_the_gpu_step_is():
    t = text()
    assert "No device was lent in session AD" in t and "TEST DOUBLE app" in t
    assert "was for `host_session.sh engine3b-anyio` on the GPU host: they do (session AE, above)" in t
    assert "tests/gpu/host_session.sh anyiocpu" in t


def test_serve_md_quotes_the_same_figures():
    serve = " ".join((REPO / "docs" / "serve.md").read_text().split())
    loop = {n: statistics.median(values(n, "loop_thread_ms_per_request")) for n in NAMES}
    assert (f"on the CPU the patched actor's server loop spent {loop['on']:.2f} ms a request, the plain process's "
            f"{loop['plain']:.2f}, upstream's in the actor {loop['off']:.2f}; on an H100 under load, session AE,") in serve
