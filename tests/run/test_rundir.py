import json

import pytest

from rftstack.run import rundir
from rftstack.errors import UserError


def test_create_makes_timestamped_dirs_and_refuses_non_empty(tmp_path):
    a = rundir.create(base=tmp_path)
    b = rundir.create(base=tmp_path)
    assert a.root != b.root and a.logs.is_dir() and b.logs.is_dir()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("data")
    with pytest.raises(UserError, match="not empty"):
        rundir.create(tmp_path / "x")
    assert (tmp_path / "x" / "f").read_text() == "data"


def test_status_file_is_rewritten_whole(tmp_path):
    st = rundir.Status(tmp_path / "status.json", run_dir=str(tmp_path))
    st.update(phase="ready", endpoint="http://127.0.0.1:1/v1")
    data = json.loads((tmp_path / "status.json").read_text())
    assert data["phase"] == "ready" and data["endpoint"].endswith("/v1") and "started_at" in data
    assert not list(tmp_path.glob(".*tmp"))


def test_rotating_log_keeps_n_backups(tmp_path):
    log = rundir.RotatingLog(tmp_path / "t.log", max_bytes=100, backups=2)
    for i in range(50):
        log.write(f"line {i:03d} " + "x" * 20)
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["t.log", "t.log.1", "t.log.2"]
    assert "line 049" in (tmp_path / "t.log").read_text() or "line 049" in (tmp_path / "t.log.1").read_text()
    assert all(p.stat().st_size < 200 for p in tmp_path.iterdir())
