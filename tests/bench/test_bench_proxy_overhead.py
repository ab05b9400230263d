"""bench/proxy_overhead.py: Trinity's real proxy app and SQLite recorder in front of a TEST DOUBLE
upstream record every response (the numbers themselves go to docs/benchmarks.md, not here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def overhead(out: Path, variants: str, concurrency: int, requests: int, max_tokens: int, *extra: str) -> subprocess.CompletedProcess:
    """bench/proxy_overhead.py with these variants and one load level (and ``extra`` arguments), its JSON to ``out``."""
    return subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(out), "--variants", variants,
                           "--concurrency", str(concurrency), "--requests", str(requests), "--max-tokens", str(max_tokens), *extra],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def test_unknown_variant_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(tmp_path / "x.json"),
                        "--variants", "postgres"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "unknown variant 'postgres'" in r.stderr and "Traceback" not in r.stderr


def test_a_variant_named_twice_is_one_sentence(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(tmp_path / "x.json"),
                        "--variants", "hop,sqlite,hop"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "variant 'hop' is named twice" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("flag", ["--upstream-delay-s", "--upstream-delay-per-token-s"])
def test_a_negative_delay_is_one_sentence(tmp_path, flag):
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(tmp_path / "x.json"),
                        "--variants", "hop", flag, "-0.1"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and r.stderr.strip() == f"proxy_overhead: {flag} takes seconds, 0 or more, not -0.1"
    assert not (tmp_path / "x.json").exists() and not list(tmp_path.iterdir())


def test_group_commit_setting_per_variant():
    import proxy_overhead as po

    got = {v: po.group_commit_setting(v) for v in ("hop", "memory", "sqlite", "sqlite-group", "sqlite-group+quiet", "sqlite-wal")}
    assert got == {"hop": None, "memory": None, "sqlite": "0", "sqlite-group": "1", "sqlite-group+quiet": "1", "sqlite-wal": "0"}


# The recording variants' tests read one run of them all side by side (c=8, 24 requests; one harness and one proxy
# start a variant, rather than a run a test with sqlite-gc started again in each: CI has 90 minutes).
SIDE_BY_SIDE = ("sqlite", "sqlite-group", "sqlite-fast", "sqlite-gc", "sqlite-gc+numeric", "sqlite-gc+actor",
                "sqlite-prebuilt", "sqlite-process", "sqlite-process4", "sqlite-build", "sqlite-record")
TODAYS = ("sqlite-gc", "sqlite-gc+numeric", "sqlite-gc+actor", "sqlite-prebuilt", "sqlite-process", "sqlite-process4",
          "sqlite-build", "sqlite-record")  # today's patches on: group commit, fast forward, gc


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory) -> tuple[dict, Path]:
    """SIDE_BY_SIDE in one run: its result and its logs folder; every response of every variant answered and recorded,
    one row each. Where the installed Trinity lacks a patch they need (the README's test command applies them with
    `rftstack relax`), the run is refused with one sentence and the tests that read it are skipped."""
    import proxy_overhead as po

    out = tmp_path_factory.mktemp("side-by-side") / "s.json"
    r = overhead(out, ",".join(SIDE_BY_SIDE), 8, 24, 5)
    problem = po.variants_problem(list(SIDE_BY_SIDE))
    if problem is not None:
        assert r.returncode == 2 and r.stderr.strip() == f"proxy_overhead: {problem}" and not out.exists()
        pytest.skip(f"the recording variants were refused as they should be: {problem}")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for v in SIDE_BY_SIDE:
        run = res["runs"][v]
        assert run["levels"][0]["ok"] == 24 and run["levels"][0]["errors"] == 0 and run["recorded_rows"] == 8 + 24, v
    for v in TODAYS:
        run = res["runs"][v]
        assert run["proxy_gc_tuning"] is True and run["proxy_fast_forward"] is True and run["recorder_group_commit"] is True
    return res, out.parent / "s-logs"


@pytest.mark.slow
def test_proxy_forwards_and_records_every_response(side_by_side):
    """Upstream's proxy and recorder (sqlite): every answer forwarded whole, one row a response (the 8 warm-up requests
    and the measured ones), its speed against going direct reported."""
    res, _ = side_by_side
    level = res["runs"]["sqlite"]["levels"][0]
    assert level["ok"] == 24 and level["errors"] == 0 and level["output_tokens"] == 24 * 5
    assert res["runs"]["sqlite"]["recorded_rows"] == 8 + 24
    assert res["summary"]["sqlite"]["8"]["vs_direct"] > 0


@pytest.mark.slow
def test_sqlite_and_sqlite_group_side_by_side(side_by_side):
    """Upstream's write path (variable 0) and the group-commit patch in one run; every response recorded by both."""
    res, _ = side_by_side
    for v, group in (("sqlite", False), ("sqlite-group", True)):
        run = res["runs"][v]
        assert run["recorder_group_commit"] is group
        assert run["proxy_cpu_ms_per_response"] > 0
    assert res["summary"]["sqlite-group"]["8"]["vs_sqlite"] > 0 and "vs_hop" not in res["summary"]["sqlite-group"]["8"]


@pytest.mark.slow
def test_http_protocol_flags_and_the_h2c_offer(tmp_path):
    """+published / +h11 / +offer: with the offer every request fails on the published httptools
    protocol (uvicorn #2722: the body is dropped, the proxy answers 400) and none fails on the
    patched one or on h11."""
    out = tmp_path / "p.json"
    variants = "hop+published+offer,hop+offer,hop+h11+offer"
    r = overhead(out, variants, 2, 6, 3)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    levels = {v: res["runs"][v]["levels"][0] for v in variants.split(",")}
    assert levels["hop+published+offer"]["ok"] == 0 and levels["hop+published+offer"]["error_kinds"] == {"http_400": 6}
    assert levels["hop+offer"]["ok"] == 6 and levels["hop+h11+offer"]["ok"] == 6
    assert res["runs"]["hop+offer"]["params"]["headers"]["Upgrade"] == "h2c"
    logs = tmp_path / "p-logs"
    assert "HTTP_PROTOCOL h11" in (logs / "proxy-hop+h11+offer.log").read_text()
    assert "HTTP_PROTOCOL httptools (published)" in (logs / "proxy-hop+published+offer.log").read_text()


def test_gc_setting_per_variant():
    import proxy_overhead as po

    got = {v: (po.gc_setting(v), po.fast_forward_setting(v), po.group_commit_setting(v))
           for v in ("hop", "hop-fast", "hop-gc", "sqlite-fast", "sqlite-gc", "sqlite-gc+quiet", "sqlite-prebuilt",
                     "sqlite-process", "sqlite-process4")}
    assert got == {"hop": ("0", "0", None), "hop-fast": ("0", "1", None), "hop-gc": ("1", "1", None),
                   "sqlite-fast": ("0", "1", "1"), "sqlite-gc": ("1", "1", "1"), "sqlite-gc+quiet": ("1", "1", "1"),
                   "sqlite-prebuilt": ("1", "1", "1"), "sqlite-process": ("1", "1", "1"),
                   "sqlite-process4": ("1", "1", "1")}


@pytest.mark.slow
def test_actor_flag_serves_the_proxy_from_a_ray_actor(side_by_side):
    """+actor: the proxy served from a Ray actor's event loop on a Ray node of the child's own, beside sqlite-gc: the
    installed (patched) Trinity in the actor too (Ray's `uv run` hook off: under `uv run` it gave the actor a fresh,
    unpatched environment), its workers at the child's niceness, one row a response, the CPU the actor's process's;
    afterwards neither the actor nor Ray's temp dir is left."""
    res, logs = side_by_side
    plain, actor = res["runs"]["sqlite-gc"], res["runs"]["sqlite-gc+actor"]
    assert plain["proxy_hosting"] == "process" and actor["proxy_hosting"] == "ray-actor"
    assert actor["proxy_niceness"] == 0 and actor["proxy_cpu_ms_per_response"] > 0
    log = (logs / "proxy-sqlite-gc+actor.log").read_text()
    (pid,) = re.findall(r"^PROXY_PID (\d+)$", log, re.M)
    (temp,) = re.findall(r"^RAY_TEMP (\S+)$", log, re.M)
    assert not Path(f"/proc/{pid}").exists() and not Path(temp).exists()


@pytest.mark.slow
def test_sqlite_prebuilt_records_a_row_per_response_with_todays_settings(side_by_side):
    """The bound on building and serializing experiences off the loop, beside sqlite-gc in one run (the fixture checks
    the rows and the settings); its proxy neither starts a recorder process nor a builder."""
    res, logs = side_by_side
    assert "recorder_cpu_ms_per_response" not in res["runs"]["sqlite-prebuilt"]
    assert "RECORDER_PID " not in (logs / "proxy-sqlite-prebuilt.log").read_text()


@pytest.mark.slow
def test_sqlite_process_records_a_row_per_response_beside_sqlite_gc(side_by_side):
    """The recording in a process of its own (bench/recorder_process.py), and in four on the one SQLite file: the
    proxy leaves the answers unparsed, every response is recorded once by a recorder process, whose CPU (the four
    processes' together) is reported beside the proxy's."""
    res, logs = side_by_side
    assert "recorder_cpu_ms_per_response" not in res["runs"]["sqlite-gc"]
    for v, processes in (("sqlite-process", 1), ("sqlite-process4", 4)):
        assert res["runs"][v]["recorder_cpu_ms_per_response"] > 0
        assert res["summary"][v]["recorder_cpu_ms_per_response"] > 0
        log = (logs / f"proxy-{v}.log").read_text()
        assert log.count("RECORDER_PID ") == processes and log.count("GROUP_COMMIT 1") == 1


@pytest.mark.slow
def test_sqlite_build_and_sqlite_record_record_a_row_per_response_beside_sqlite_gc(side_by_side):
    """patches/trinity-proxy-build-processes.patch in the benchmark: sqlite-build's proxy has one experience builder,
    sqlite-record's one recording process (it commits the rows), each measured once it is ready, its CPU reported
    beside the proxy's; sqlite-gc's has neither (the variables at 0). One row a response in every variant."""
    res, logs = side_by_side
    for v in ("sqlite-build", "sqlite-record"):  # reported; /proc counts in 10 ms ticks, and 32 answers can take fewer
        assert res["runs"][v]["recorder_cpu_ms_per_response"] is not None  # there only where their pids were found
    assert "recorder_cpu_ms_per_response" not in res["runs"]["sqlite-gc"]
    build = (logs / "proxy-sqlite-build.log").read_text()
    assert "Experience builders: 1 processes (RFTSTACK_PROXY_BUILD_PROCESSES=1, rftstack patch)" in build
    assert len(re.findall(r"Experience builder \d+ ready", build)) == 1 and "Experience recorder" not in build
    record = (logs / "proxy-sqlite-record.log").read_text()
    assert "Experience recorders: 1 processes (RFTSTACK_PROXY_RECORD_PROCESSES=1, rftstack patch)" in record
    assert len(re.findall(r"Experience recorder \d+ ready", record)) == 1 and "Experience builder" not in record
    assert "Experience builders:" not in (logs / "proxy-sqlite-gc.log").read_text()


def test_gc_window_counts_only_the_collections_inside_it():
    import proxy_overhead as po

    events = [[9.0, 2, 0.5], [10.0, 0, 0.001], [10.5, 1, 0.004], [11.0, 2, 0.25], [12.5, 0, 0.002]]
    assert po.gc_in_window(events, 10.0, 12.0, 100) == {
        "collections": [1, 1, 1], "wall_ms": [1.0, 4.0, 250.0], "max_pause_ms": 250.0, "wall_ms_per_response": 2.55}
    assert po.gc_in_window([], 0.0, 1.0, 0)["wall_ms_per_response"] is None


@pytest.mark.slow
def test_sqlite_fast_and_sqlite_gc_side_by_side(side_by_side):
    """The gc patch off (sqlite-fast) and on (sqlite-gc) in one run: every response recorded by both (the fixture),
    the collector's work in the load window reported, and the patch's log line only where it is on."""
    res, logs = side_by_side
    for v, on in (("sqlite-fast", False), ("sqlite-gc", True)):
        run = res["runs"][v]
        assert run["proxy_gc_tuning"] is on and run["proxy_fast_forward"] is True and run["recorder_group_commit"] is True
        assert len(run["gc"]["collections"]) == 3 and run["gc"]["wall_ms_per_response"] is not None
        log = (logs / f"proxy-{v}.log").read_text()
        assert ("objects frozen for the garbage collector (RFTSTACK_PROXY_GC=1, rftstack patch)" in log) is on, v
    assert "gc_max_pause_ms" in res["summary"]["sqlite-gc"]


@pytest.mark.slow
def test_numeric_flag_side_by_side(side_by_side):
    """sqlite-gc with upstream's logprobs objects and with +numeric (the double answering as the patched vLLM):
    every response recorded by both (the fixture), the proxy's switch as the flag says."""
    res, _ = side_by_side
    for v, on in (("sqlite-gc", False), ("sqlite-gc+numeric", True)):
        assert res["runs"][v]["proxy_numeric_logprobs"] is on


def busy_loops() -> list[int]:
    """Pids of processes running proxy_overhead's BUSY_LOOP (its --busy spinners)."""
    import proxy_overhead as po

    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[2:3] == [po.BUSY_LOOP.encode()]:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_nice15_runs_the_proxy_at_rays_niceness_beside_busy_processes(tmp_path):
    """+nice15: the proxy process at niceness 15 (Ray's for the Explorer actor), the other at this process's; --busy 1:
    one spinning process through every run, none left after; the machine's autogroup switch is recorded."""
    import os

    out = tmp_path / "p.json"
    r = overhead(out, "hop-gc,hop-gc+nice15", 2, 10, 5, "--busy", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert res["runs"]["hop-gc"]["proxy_niceness"] == own and res["runs"]["hop-gc+nice15"]["proxy_niceness"] == max(own, 15)
    assert all(res["runs"][v]["levels"][0]["ok"] == 10 for v in ("hop-gc", "hop-gc+nice15"))
    assert res["busy_processes"] == 1 and busy_loops() == []
    assert res["machine"]["sched_autogroup"] == Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()


def test_a_proxy_that_does_not_start_in_time_is_a_result(tmp_path):
    """--startup-timeout-s: a variant whose proxy does not answer /health in time gets its sentence in the result and
    the summary, and the next variant still runs (here it cannot start in time either)."""
    out = tmp_path / "p.json"
    r = overhead(out, "hop-gc,hop", 2, 4, 5, "--startup-timeout-s", "0.01")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for v in ("hop-gc", "hop"):
        assert res["runs"][v]["levels"] == [] and res["runs"][v]["proxy_startup_s"] is None
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/health did not answer within 0\.01 s", res["summary"][v]["start_error"])
    assert res["runs"]["direct"]["levels"][0]["ok"] == 4


def test_busy_takes_no_negative_count(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench/proxy_overhead.py"), "--out", str(tmp_path / "x.json"), "--variants", "hop",
                        "--busy", "-1"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip() == "proxy_overhead: --busy takes a number of spinning processes, 0 or more"


def test_upstream_delay_per_token_reaches_the_double(tmp_path):
    """--upstream-delay-per-token-s: the double answers 25 tokens 0.5 s or more after the request (direct and through
    the proxy), and the result says with which delays it ran."""
    out = tmp_path / "t.json"
    r = overhead(out, "hop", 2, 4, 25, "--upstream-delay-per-token-s", "0.02")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["upstream_delay_per_token_s"] == 0.02 and result["upstream_delay_s"] == 0.0
    for run in ("direct", "hop"):
        (lv,) = result["runs"][run]["levels"]
        assert lv["ok"] == 4 and lv["latency_s"]["p50"] >= 0.5, (run, lv["latency_s"])
