"""fetch: real downloads of one small wheel from PyPI's file host, with resume and hash checks."""

from __future__ import annotations

import pytest

from rftstack.bundle import fetch
from rftstack.errors import UserError

# six 1.17.0's wheel as uv.lock records it (11 KiB)
URL = "https://files.pythonhosted.org/packages/b7/ce/149a00dd41f10bc29e5921b496af8b574d8413afcd5e30dfa0ed46c2cc5e/six-1.17.0-py2.py3-none-any.whl"
SHA = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
SIZE = 11050


def test_download_then_present_then_resume_after_truncation(tmp_path):
    dest = tmp_path / "six-1.17.0-py2.py3-none-any.whl"
    seen = []
    assert fetch.download(URL, dest, SHA, SIZE, advance=seen.append) == fetch.DOWNLOADED
    assert sum(seen) == SIZE and fetch.sha256_file(dest) == SHA
    assert fetch.download(URL, dest, SHA, SIZE) == fetch.PRESENT
    # an interrupted download: the file is cut short; the next run continues it (HTTP Range)
    data = dest.read_bytes()
    dest.write_bytes(data[:4000])
    seen.clear()
    assert fetch.download(URL, dest, SHA, SIZE, advance=seen.append) == fetch.RESUMED
    assert dest.read_bytes() == data
    assert seen[0] == 4000 and sum(seen) == SIZE  # the kept prefix counts, then only the rest came
    assert not dest.with_name(dest.name + ".part").exists()


def test_partial_file_continues(tmp_path):
    dest = tmp_path / "six.whl"
    part = tmp_path / "six.whl.part"
    fetch.download(URL, dest, SHA, SIZE)
    part.write_bytes(dest.read_bytes()[:7000])
    dest.unlink()
    assert fetch.download(URL, dest, SHA, SIZE) == fetch.RESUMED
    assert fetch.sha256_file(dest) == SHA


def test_damaged_prefix_restarts_cleanly(tmp_path):
    dest = tmp_path / "six.whl"
    (tmp_path / "six.whl.part").write_bytes(b"\0" * 5000)  # not the file's first bytes
    assert fetch.download(URL, dest, SHA, SIZE) == fetch.RESUMED
    assert fetch.sha256_file(dest) == SHA


def test_hash_mismatch_names_file_and_both_hashes(tmp_path):
    wrong = "0" * 64
    with pytest.raises(UserError) as exc:
        fetch.download(URL, tmp_path / "six.whl", wrong, SIZE)
    msg = str(exc.value)
    assert "six.whl" in msg and SHA in msg and wrong in msg
    assert not list(tmp_path.iterdir())  # nothing half-made is left
