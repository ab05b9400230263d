"""Dotted keys ("explorer.rollout_model.model_path") into a nested config mapping, one meaning
for every part: a level that is absent or not a mapping is UNSET; a null (YAML `~`) is None."""

from __future__ import annotations

from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def lookup(cfg: dict, key: str) -> Any:
    """The value at ``key``: None when it is null, UNSET when a level is absent."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return UNSET
        node = node[part]
    return node


def get(cfg: dict, key: str, default: Any = None) -> Any:
    """The value at ``key``, or ``default`` when it is absent or null."""
    value = lookup(cfg, key)
    return default if value is UNSET or value is None else value


def is_set(cfg: dict, key: str) -> bool:
    """Whether ``key`` holds a value other than null."""
    return get(cfg, key, UNSET) is not UNSET


def put(cfg: dict, key: str, value: Any) -> None:
    """Set ``key`` to ``value``, making the levels it needs (a non-mapping level is replaced)."""
    parts = key.split(".")
    node = cfg
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
