"""Is the proxy ready? (`/health` and `/v1/models` both answer), and what to show while waiting."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import urllib.error
import urllib.request

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NOISE = re.compile(r"^[\s=\-*#.>|]*$")


@dataclasses.dataclass(frozen=True)
class Ready:
    health: bool
    models: list[str]  # model ids from /v1/models (empty until it answers)
    detail: str  # why not ready, for progress lines

    @property
    def ok(self) -> bool:
        return self.health and bool(self.models)


def http_get(url: str, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered. An https URL is this serve's own proxy on
    loopback: its certificate (the user's, for their host name) is not verified here."""
    import ssl

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ctx = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b""
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return 0, str(getattr(exc, "reason", exc)).encode()


def model_ids(body: bytes) -> list[str]:
    try:
        data = json.loads(body)
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        return []


def check(base_url: str, timeout: float = 5.0, api_key: str | None = None) -> Ready:
    status, body = http_get(base_url + "/health", timeout, api_key)
    if status != 200:
        return Ready(False, [], f"/health: {status or body.decode(errors='replace')[:80]}")
    status, body = http_get(base_url + "/v1/models", timeout, api_key)
    ids = model_ids(body) if status == 200 else []
    return Ready(True, ids, "" if ids else f"/v1/models: {status} {body[:80]!r}")


def clean(line: str) -> str:
    return _ANSI.sub("", line).replace("\r", " ").strip()


def last_meaningful(lines: list[str], width: int = 160) -> str | None:
    """The last line worth showing in a progress line: no colour codes, no blank or ruler lines."""
    for line in reversed(lines):
        text = clean(line)
        if text and not _NOISE.match(text):
            return text if len(text) <= width else text[: width - 3] + "..."
    return None


def curl_example(base_url: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16})
    return (
        f"curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
