"""bundle_layout: cutting files into parts of bounded size."""

from __future__ import annotations

from rftstack.bundle.layout import cut, pack


def test_big_files_are_chunked_and_every_part_fits():
    files = [("big.whl", 2500), ("mid.whl", 900), ("a.whl", 300), ("b.whl", 100), ("c.whl", 1000)]
    parts = pack(files, 1000)
    for part in parts:
        assert sum(p.size for p in part) <= 1000
    pieces = sorted((p for part in parts for p in part if p.file == "big.whl"), key=lambda p: p.offset)
    assert [p.name for p in pieces] == ["big.whl.000", "big.whl.001", "big.whl.002"]
    assert [(p.offset, p.size) for p in pieces] == [(0, 1000), (1000, 1000), (2000, 500)]
    # files up to the capacity stay whole
    assert [p.name for part in parts for p in part if p.file == "c.whl"] == ["c.whl"]
    # every byte is placed exactly once
    assert sum(p.size for part in parts for p in part) == sum(s for _, s in files)
    # first-fit decreasing: 4800 bytes in 1000-byte parts need 5
    assert len(parts) == 5


def test_pack_is_deterministic():
    files = [(f"f{i}.whl", 37 * i % 500 + 1) for i in range(40)]
    assert pack(files, 700) == pack(list(reversed(files)), 700)


def test_cut_exact_multiple():
    assert [p.size for p in cut("x", 2000, 1000)] == [1000, 1000]
    assert cut("x", 1000, 1000)[0].chunk is None
