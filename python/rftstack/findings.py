"""Findings: the common currency of doctor, env and serve's preflight.

A finding is one checked fact: a status (ok / info / warn / fail), a one-sentence message, and,
when it is not ok, a one-sentence fix.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
_RANK = {OK: 0, INFO: 1, WARN: 2, FAIL: 3}


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str  # a stable id, e.g. "driver", "elf.vllm", "config.max_model_len"
    status: str  # OK, INFO, WARN or FAIL
    message: str  # one sentence: what was found
    fix: str = ""  # one sentence: what to do (empty when status is OK)
    data: dict = dataclasses.field(default_factory=dict)  # machine-readable details for --json

    def __post_init__(self):
        if self.status not in _RANK:
            raise ValueError(f"unknown finding status {self.status!r}")


def worst(findings: Iterable[Finding]) -> str:
    return max((f.status for f in findings), key=_RANK.__getitem__, default=OK)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when nothing failed, 1 when a check failed."""
    return 1 if worst(findings) == FAIL else 0


def to_json(findings: Iterable[Finding], **extra) -> str:
    items = [dataclasses.asdict(f) for f in findings]
    return json.dumps({**extra, "status": worst(Finding(**i) for i in items), "findings": items}, indent=2)


_MARK = {OK: "ok  ", INFO: "info", WARN: "WARN", FAIL: "FAIL"}


def render(findings: Iterable[Finding]) -> str:
    """Human output: one line per finding, the fix indented under it."""
    lines = []
    for f in findings:
        lines.append(f"[{_MARK[f.status]}] {f.check}: {f.message}")
        if f.fix and f.status in (WARN, FAIL):
            lines.append(f"       fix: {f.fix}")
    return "\n".join(lines)
