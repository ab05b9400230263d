"""bench/recorder_process.py: the proxy's recording in a process of its own (variant sqlite-process of
bench/proxy_overhead.py). Real: the recorder process (Trinity's record_experience, HistoryRecorder and
SQLite file), its Unix socket and the proxy's client of it (the variant itself:
tests/bench/test_bench_proxy_overhead.py)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSWER = {"id": "chatcmpl-1", "prompt_token_ids": [1, 2, 3],
          "choices": [{"index": 0, "token_ids": [4, 5], "message": {"role": "assistant", "content": "hi"},
                       "logprobs": {"content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]}},
                      {"index": 1, "token_ids": [6], "message": {"role": "assistant", "content": "!"},
                       "logprobs": {"content": [{"token": "!", "logprob": -1.0}]}}]}  # fmt: skip


@pytest.fixture
def recorder(tmp_path):
    """The recorder process on a new SQLite file, started as the proxy's variant starts it, and its client."""
    import proxy_overhead as po

    db = tmp_path / "h.db"
    child, client = po.start_recorder_process(f"sqlite:///{db}", str(tmp_path))
    yield child, client, db
    po.stop_recorder(child)


def test_answers_are_recorded_by_the_other_process_and_a_bad_one_is_a_sentence(recorder):
    child, client, db = recorder

    async def go():
        counts = await asyncio.gather(*(client.record(json.dumps({**ANSWER, "id": f"chatcmpl-{i}"}).encode(), 7)
                                        for i in range(20)))  # fmt: skip
        with pytest.raises(RuntimeError, match="the recorder process could not record the answer: "):
            await client.record(b"not json", 7)
        return counts

    assert asyncio.run(go()) == [2] * 20  # two choices, two experiences each
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=30) == 0
    rows = sqlite3.connect(db).execute("select count(*) from proxy_history").fetchone()[0]
    assert rows == 40


def test_a_recorder_that_is_gone_fails_what_is_in_flight_with_a_sentence(recorder):
    child, client, _ = recorder

    async def go():
        assert await client.record(json.dumps(ANSWER).encode(), 0) == 2
        child.send_signal(signal.SIGSTOP)  # it reads nothing more and acknowledges nothing more
        in_flight = asyncio.ensure_future(client.record(json.dumps(ANSWER).encode(), 0))
        await asyncio.sleep(0.5)
        assert not in_flight.done()
        child.kill()
        child.wait(timeout=30)
        with pytest.raises(RuntimeError, match="the recorder process at .* closed its connection"):
            await in_flight
        with pytest.raises(RuntimeError, match="the recorder process at .* does not answer: "):
            await client.record(json.dumps(ANSWER).encode(), 0)

    asyncio.run(go())


RUNS = ("proxy-overhead-cpu-process.json", "proxy-overhead-cpu-process-reversed.json", "proxy-overhead-cpu-process-2.json")
LABELS = {"sqlite-gc": "today's proxy (`sqlite-gc`)", "sqlite-process": "recording in its own process (`sqlite-process`)",
          "sqlite-prebuilt": "experiences prebuilt, the bound (`sqlite-prebuilt`)", "hop-gc": "forwarding only (`hop-gc`)"}
# the GPU host's CPU (16 cores, no GPU used), session S: host_session.sh proxycpu-process, two orders
HOST_RUNS = ("gpu-2026-12-04s/proxy-overhead-host-process1.json", "gpu-2026-12-04s/proxy-overhead-host-process2.json")
HOST_LABELS = {**LABELS, "sqlite-process4": "four recording processes (`sqlite-process4`)"}
# the CPU machine, this session: patches/trinity-proxy-build-processes.patch's second version, two orders
BUILD_RUNS = ("proxy-overhead-cpu-build.json", "proxy-overhead-cpu-build-reversed.json")
BUILD_LABELS = {"sqlite-gc": LABELS["sqlite-gc"], "sqlite-build": "one experience builder (`sqlite-build`)",
                "sqlite-process": LABELS["sqlite-process"]}

# session U: the patch's recording processes, on the CPU machine (two orders) and on the GPU host's CPU (two orders)
RECORD_RUNS = ("proxy-overhead-cpu-record1.json", "proxy-overhead-cpu-record2.json")
RECORD_LABELS = {"sqlite-gc": LABELS["sqlite-gc"], "sqlite-record": "one recording process, the patch (`sqlite-record`)",
                 "sqlite-process": LABELS["sqlite-process"]}
HOST_RECORD_RUNS = ("gpu-2026-12-04u/proxy-overhead-host-record1.json", "gpu-2026-12-04u/proxy-overhead-host-record2.json")
HOST_RECORD_LABELS = {"sqlite-gc": LABELS["sqlite-gc"], "sqlite-build4": "four experience builders (`sqlite-build4`)",
                      "sqlite-record4": "four recording processes, the patch (`sqlite-record4`)"}


def process_table(results: Path, runs: tuple[str, ...] = RUNS, labels: dict[str, str] = LABELS) -> str:
    """docs/benchmarks.md's table of the sqlite-process runs, computed from their result files."""
    summaries = [json.loads((results / name).read_text())["summary"] for name in runs]
    names = " / ".join(str(i + 1) for i in range(len(runs)))

    def cells(variant: str, key: str, fmt: str) -> str:
        return " / ".join(fmt.format(run[variant][key]) if key in run[variant] else "-" for run in summaries)

    lines = [f"| path (0.27 s double); runs {names} | c=32, of direct | c=64, of direct | c=32, added p50 (ms) "
             "| proxy CPU per response (ms) | recorder process CPU (ms) |", "|---|---|---|---|---|---|"]
    for variant, label in labels.items():
        c32 = " / ".join(f"{run[variant]['32']['vs_direct']:.3f}" for run in summaries)
        c64 = " / ".join(f"{run[variant]['64']['vs_direct']:.3f}" for run in summaries)
        p50 = " / ".join(f"{run[variant]['32']['added_p50_ms']:.1f}" for run in summaries)
        lines.append(f"| {label} | {c32} | {c64} | {p50} | {cells(variant, 'cpu_ms_per_response', '{:.2f}')} "
                     f"| {cells(variant, 'recorder_cpu_ms_per_response', '{:.2f}')} |")
    return "\n".join(lines)


@pytest.mark.parametrize("runs, labels", [(RUNS, LABELS), (HOST_RUNS, HOST_LABELS), (BUILD_RUNS, BUILD_LABELS),
                                         (RECORD_RUNS, RECORD_LABELS), (HOST_RECORD_RUNS, HOST_RECORD_LABELS)],
                         ids=["cpu-machine", "gpu-host-cpu", "cpu-machine-builders", "cpu-machine-recorders",
                              "gpu-host-cpu-recorders"])  # fmt: skip
def test_the_docs_tables_of_the_recorder_process_are_what_the_result_files_hold(runs, labels):
    table = process_table(REPO / "bench" / "results", runs, labels)
    assert table in (REPO / "docs" / "benchmarks.md").read_text(), "docs/benchmarks.md should hold:\n" + table
