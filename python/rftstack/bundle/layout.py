"""How a bundle's files are cut into parts of at most N bytes: a pure function.

A file larger than a part's capacity is cut into chunks ``NAME.000``, ``NAME.001`` ... of exactly
the capacity (the last one shorter); every piece (whole file or chunk) then goes into the first
part it fits, largest pieces first (first-fit decreasing), so the parts are few and full.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Piece:
    file: str  # the bundle file it belongs to
    name: str  # its file name inside a part (the file's own name, or NAME.NNN for a chunk)
    offset: int
    size: int
    chunk: int | None  # chunk index, None for a whole file


def cut(name: str, size: int, capacity: int) -> list[Piece]:
    if size <= capacity:
        return [Piece(name, name, 0, size, None)]
    pieces = []
    for i, off in enumerate(range(0, size, capacity)):
        pieces.append(Piece(name, f"{name}.{i:03d}", off, min(capacity, size - off), i))
    return pieces


def pack(files: list[tuple[str, int]], capacity: int) -> list[list[Piece]]:
    """Parts (lists of pieces) for ``files`` ((name, size) pairs), each part's pieces summing to
    at most ``capacity`` bytes. Deterministic for the same input."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    pieces = [p for name, size in files for p in cut(name, size, capacity)]
    pieces.sort(key=lambda p: (-p.size, p.name))
    parts: list[list[Piece]] = []
    free: list[int] = []
    for p in pieces:
        for i, room in enumerate(free):
            if p.size <= room:
                parts[i].append(p)
                free[i] -= p.size
                break
        else:
            parts.append([p])
            free.append(capacity - p.size)
    return parts
