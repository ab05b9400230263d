"""bench/proxy_profile.py: the categorisation of py-spy's collapsed stacks (frames copied from a real
py-spy record of Trinity's proxy under load) and the CLI's refusals. No py-spy needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
import proxy_profile as pp

SP = "/srv/app/.venv/lib/python3.11/site-packages"  # a py-spy sample as recorded, paths made neutral
LIB = "/usr/lib/python3.11"
MAIN = (f"thread (3474): MainThread;<module> (/srv/app/bench/proxy_overhead.py:251);"
        f"run ({LIB}/asyncio/runners.py:190);BaseEventLoop.run_forever ({LIB}/asyncio/base_events.py:607);"
        f"BaseEventLoop._run_once ({LIB}/asyncio/base_events.py:1922);Handle._run ({LIB}/asyncio/events.py:80)")
APP = (f"{MAIN};RequestResponseCycle.run_asgi ({SP}/uvicorn/protocols/http/h11_impl.py:410);"
       f"Route.handle ({SP}/starlette/routing.py:289);chat_completions ({SP}/trinity/explorer/proxy/app.py:323)")
WORKER = (f"thread (3943): Thread-63 (_connection_worker_thread);Thread._bootstrap ({LIB}/threading.py:1002);"
          f"Thread.run ({LIB}/threading.py:982);_connection_worker_thread ({SP}/aiosqlite/core.py:63)")
SAMPLE = "\n".join([
    # starlette's JSONResponse renders with json.dumps: the json frame is nearer the leaf
    (f"{APP};JSONResponse.render ({SP}/starlette/responses.py:200);dumps ({LIB}/json/__init__.py:238);"
    f"JSONEncoder.iterencode ({LIB}/json/encoder.py:258) 8"),
    # h11 under httpcore is the client side: httpx forwarding
    (f"{APP};AsyncHTTP11Connection._receive_event ({SP}/httpcore/_async/http11.py:214);"
    f"Connection.next_event ({SP}/h11/_connection.py:481);validate ({SP}/h11/_util.py:92) 1"),
    # h11 under uvicorn is the server side
    (f"{MAIN};H11Protocol.data_received ({SP}/uvicorn/protocols/http/h11_impl.py:174);"
    f"Connection.next_event ({SP}/h11/_connection.py:481) 3"),
    # Trinity's get_logger on every record: setLevel clears the logging cache
    (f"{APP};ExplorerService.record_experience ({SP}/trinity/explorer/proxy/service.py:164);"
    f"HistoryRecorder.record_history ({SP}/trinity/explorer/proxy/recorder.py:45);"
    f"async_run_with_retry_session ({SP}/trinity/buffer/utils.py:28);get_logger ({SP}/trinity/utils/log.py:79);"
    f"Logger.setLevel ({LIB}/logging/__init__.py:1465);Manager._clear_cache ({LIB}/logging/__init__.py:1424) 24"),
    (f"{APP};ExplorerService.record_experience ({SP}/trinity/explorer/proxy/service.py:164);"
    f"HistoryRecorder.record_history ({SP}/trinity/explorer/proxy/recorder.py:45);"
    f"HistoryRecorder.record_history.<locals>.operation ({SP}/trinity/explorer/proxy/recorder.py:43);"
    f"Experience.serialize ({SP}/trinity/common/experience.py:303);"
    f"Experience.serialize_many ({SP}/trinity/common/experience.py:371) 4"),
    f"{APP};ExplorerService.record_experience ({SP}/trinity/explorer/proxy/service.py:143) 4",
    (f"{APP};ExplorerService.record_experience ({SP}/trinity/explorer/proxy/service.py:164);"
    f"UOWTransaction.__init__ ({SP}/sqlalchemy/orm/unitofwork.py:197) 4"),
    f"{MAIN};EpollSelector.select ({LIB}/selectors.py:468) 165",
    f"{WORKER} 918",
    # --native: sqlite's busy handler sleeping, and fdatasync at commit
    (f"{WORKER};0x7f25a644b1b5 (/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6);usleep (/usr/lib/x86_64-linux-gnu/libc.so.6);"
    f"nanosleep (/usr/lib/x86_64-linux-gnu/libc.so.6) 990"),
    (f"{WORKER};sqlite3PagerCommitPhaseOne (/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6);"
    f"fdatasync (/usr/lib/x86_64-linux-gnu/libc.so.6) 28"),
    "thread (3474): MainThread 4",
])


def cat(line: str) -> str:
    frames = line.rpartition(" ")[0].split(";")
    return pp.categorise(frames[1:])


def test_each_sample_gets_the_category_of_its_first_matching_frame_from_the_leaf():
    got = [cat(line) for line in SAMPLE.splitlines()]
    assert got == [
        "JSON encode/decode (stdlib json)",
        "httpx/httpcore forwarding",
        "uvicorn HTTP server (h11 parsing, transport)",
        "logging (uvicorn access log, Trinity get_logger)",
        "Experience serialization (safetensors + pickle)",
        "Experience build (torch tensors)",
        "SQLAlchemy (ORM, core, async adaptation)",
        "event loop in epoll_wait (mostly idle: waiting for the DB or upstream)",
        "aiosqlite/sqlite3 (incl. worker threads)",
        "sqlite busy wait (usleep: another connection holds the lock)",
        "sqlite fdatasync/fsync",
        "other",
    ]


def test_summary_counts_threads_categories_and_self_time():
    s = pp.summarise(pp.read_collapsed(SAMPLE + "\n"))
    assert s["samples"] == 8 + 1 + 3 + 24 + 4 + 4 + 4 + 165 + 918 + 990 + 28 + 4
    assert s["samples_by_thread"] == {"aiosqlite": 918 + 990 + 28, "main": 8 + 1 + 3 + 24 + 4 + 4 + 4 + 165 + 4}
    main = s["categories_by_thread"]["main"]
    assert main[pp.EPOLL]["samples"] == 165
    assert round(sum(v["pct"] for v in main.values())) == 100
    assert s["top_self"][0] == {"function": "nanosleep (@native)", "samples": 990, "pct": round(100 * 990 / s["samples"], 2)}
    assert s["top_self"][1]["function"] == "_connection_worker_thread (aiosqlite/core.py)"


def test_normalised_stacks_drop_thread_ids_and_long_paths():
    norm = pp.normalise(pp.read_collapsed(SAMPLE))
    assert pp.summarise(pp.read_collapsed(norm)) == pp.summarise(pp.read_collapsed(SAMPLE))  # re-readable
    assert "/site-packages/" not in norm and "thread (3943)" not in norm
    assert "thread: aiosqlite;Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);" \
           "_connection_worker_thread (aiosqlite/core.py:63) 918\n" in norm
    assert "usleep (native)" in norm


def test_cpu_ms_by_category_uses_main_thread_shares():
    s = {"categories_by_thread": {"main": {"a": {"pct": 60.0}, "b": {"pct": 20.0}, pp.EPOLL: {"pct": 20.0}}}}
    t = pp.ms_table(s, {"cpu_ms_per_response_main": 4.0, "cpu_ms_per_response_other_threads": 0.5})
    assert t["a"] == 3.0 and t["b"] == 1.0 and t[pp.EPOLL] == 0.0 and t["(aiosqlite worker + other threads: their measured CPU)"] == 0.5


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench/proxy_profile.py"), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_unknown_variant_is_one_sentence(tmp_path):
    r = run_cli("--out", str(tmp_path / "x.json"), "--variants", "postgres")
    assert r.returncode == 2 and "unknown variant 'postgres'" in r.stderr and "Traceback" not in r.stderr


def test_bad_numbers_and_missing_out_are_one_sentence(tmp_path):
    r = run_cli("--out", str(tmp_path / "x.json"), "--duration-s", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr and "Traceback" not in r.stderr
    r = run_cli()
    assert r.returncode == 2 and "--out is required" in r.stderr


def test_missing_py_spy_names_the_fix(tmp_path):
    r = run_cli("--out", str(tmp_path / "x.json"), "--py-spy", str(tmp_path / "no-such-py-spy"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "py-spy is not available" in r.stderr and "uv tool install py-spy" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()


def test_each_main_thread_sample_gets_the_stage_of_its_first_matching_frame_from_the_leaf():
    top = "thread: main;Handle._run (asyncio/events.py:80);Starlette.__call__ (starlette/applications.py:96)"
    chat = top + ";chat_completions (trinity/explorer/proxy/app.py:575)"
    stacks = [
        (chat + ";_fast_loads (trinity/explorer/proxy/app.py:87)", 4),
        (chat + ";ExplorerService.record_experience (trinity/explorer/proxy/service.py:200);Tensor.__new__ (torch/_tensor.py:10)", 2),
        (chat + ";ExplorerService.record_experience (trinity/explorer/proxy/service.py:221);HistoryRecorder.record_history "
                "(trinity/explorer/proxy/recorder.py:102);HistoryRecorder._record_grouped (trinity/explorer/proxy/recorder.py:110);"
                "Experience.serialize (trinity/common/experience.py:303);save (safetensors/torch.py:1)", 3),
        ("thread: main;Handle._run (asyncio/events.py:80);HistoryRecorder._write_queued (trinity/explorer/proxy/recorder.py:180);"
         "HistoryRecorder._commit_batch (trinity/explorer/proxy/recorder.py:170);AsyncSession.execute (sqlalchemy/ext/asyncio/session.py:1)", 1),
        (chat + ";_build_downstream_headers (trinity/explorer/proxy/app.py:300)", 2),
        (top + ";h11 (uvicorn/protocols/http/httptools_impl.py:1)", 4),
        ("thread: main;EpollSelector.select (selectors.py:468)", 50),  # idle: not CPU
        ("thread: aiosqlite;_connection_worker_thread (aiosqlite/core.py:59)", 9),  # not the main thread
    ]
    got = pp.stages_ms([(line.split(";"), n) for line, n in stacks], {"cpu_ms_per_response_main": 2.0})
    assert got == {
        "parsing the engine's answer (orjson)": 0.5,
        "HTTP server, routing, event loop (outside chat_completions)": 0.5,
        "experience serialization (safetensors + pickle)": 0.375,
        "experience build (torch tensors)": 0.25,
        "chat_completions: request rewrite, response, headers": 0.25,
        "group commit: rows, SQL, commit (writer task)": 0.125,
    }
