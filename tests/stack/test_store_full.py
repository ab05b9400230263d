"""The experience store on a full disk: Trinity's real proxy app and SQLite recorder, the database
on a real 256 KiB tmpfs filled to the last byte.

Real: the FastAPI app (with rftstack's patches, as `rftstack relax` installs it), Trinity's
ExplorerService.record_experience / record_feedback, its HistoryRecorder (SQLAlchemy + aiosqlite),
a real file system that is full. TEST DOUBLES: the upstream vLLM server (in-process, distinct
response ids) and the service's model allocation, as in tests/stack/test_proxy_bad_requests.py.
Needs root (mount); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")

from helpers import fill
from proxy_helpers import Service, load_app, upstream

from doubles.vllm_stream_double import VLLMStreamDouble

pytestmark = pytest.mark.slow


def rows(db: Path) -> list[tuple[str, float | None]]:
    con = sqlite3.connect(db)
    try:
        return list(con.execute("select msg_id, reward from proxy_history order by msg_id"))
    finally:
        con.close()


def test_full_store_refuses_the_response_and_keeps_what_was_recorded(tmp_path, full_fs):
    app_mod, service_mod = load_app(True, tmp_path)
    db = full_fs / "proxy_history.db"
    service = Service(service_mod, db)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}

    async def scenario() -> dict:
        app = app_mod.app
        app.state.service, app.state.temperature, app.state.inference_timeout = service, 1.0, 30
        app.state.models_cache = None
        app.state.http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream()))
        out: dict = {}
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=60) as c:
            out["before"] = [(await c.post("/v1/chat/completions", json=chat)).status_code for _ in range(3)]
            out["rows_before"] = rows(db)
            filler = fill(full_fs)
            # fill the rest of what SQLite keeps free inside the file, then one more: the disk is full
            statuses = []
            for _ in range(40):
                r = await c.post("/v1/chat/completions", json=chat)
                statuses.append((r.status_code, r.text))
                if r.status_code != 200:
                    break
            out["full"] = statuses
            out["rows_full"] = rows(db)
            r = await c.post("/feedback", json={"msg_ids": [out["rows_before"][0][0]], "reward": 1.0})
            out["feedback_full"] = (r.status_code, r.json())
            # a streamed request on the full disk: vLLM's stream (TEST DOUBLE) goes out, recording fails
            plain_upstream = app.state.http_client
            app.state.http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=VLLMStreamDouble().app))
            async with c.stream("POST", "/v1/chat/completions", json=dict(chat, max_tokens=4, stream=True)) as r:
                out["stream_full"] = (r.status_code, (await r.aread()).decode())
            await app.state.http_client.aclose()
            app.state.http_client = plain_upstream
            out["rows_after_stream"] = rows(db)
            os.remove(filler)
            r = await c.post("/v1/chat/completions", json=chat)
            out["after"] = r.status_code
            out["rows_after"] = rows(db)
        await app.state.http_client.aclose()
        return out

    out = asyncio.run(scenario())
    assert out["before"] == [200, 200, 200] and len(out["rows_before"]) == 3
    # with the disk full the proxy answers one sentence (rftstack's store-errors patch; Trinity's own
    # answer was a bare 500 "Internal Server Error") and returns no unrecorded generation
    def sentence(lost: str) -> str:
        return (f"the experience store is full (database or disk is full: sqlite:///{db}), so {lost}; "
                "free space on that disk or point explorer.db_url elsewhere, then retry")

    def error(lost: str) -> dict:
        return {"error": {"message": sentence(lost), "type": "experience_store", "code": 507}}

    response_lost = "this response was not recorded and is not returned"
    last_status, last_text = out["full"][-1]
    assert last_status == 507 and json.loads(last_text) == error(response_lost), out["full"]
    assert out["feedback_full"] == (507, error("this reward was not recorded"))
    # the stream: the tokens went out, but it ends with the error event, not [DONE], and left no row
    status, text = out["stream_full"]
    events = [e for e in text.split("\n\n") if e.strip()]
    assert status == 200 and "data: [DONE]" not in events, events[-3:]
    assert json.loads(events[-1][len("data: "):]) == error(response_lost)
    assert any('"token_ids"' in e for e in events[:-1])  # vLLM's chunks were forwarded before the failure
    assert out["rows_after_stream"] == out["rows_full"]
    assert all(s == 200 for s, _ in out["full"][:-1])  # those fitted in SQLite's free pages
    recorded_while_filling = len(out["rows_full"]) - 3
    assert recorded_while_filling == len(out["full"]) - 1  # every 200 was recorded, the 500 was not
    # nothing recorded before is lost or damaged; the store works again once there is space
    con = sqlite3.connect(db)
    assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    con.close()
    assert set(out["rows_full"]) <= set(out["rows_after"])
    assert out["after"] == 200 and len(out["rows_after"]) == len(out["rows_full"]) + 1
    print(f"disk full: {len(out['full']) - 1} more response(s) fitted, then {last_status} {last_text!r}; "
          f"/feedback on the full disk: {out['feedback_full']}; stream ended with {events[-1]!r}")
