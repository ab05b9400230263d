"""The proxy's API key for `rftstack serve --expose`: made once, kept 0600 in the job directory (so a
restart on the same data keeps it), handed to Trinity's proxy as a file path (the policy's
trinity-proxy-api-key patch reads it), never as a value in an environment, a config or a log.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from rftstack.errors import UserError

FILE_NAME = "proxy_api_key"
KEY_FILE_VAR = "RFTSTACK_PROXY_KEY_FILE"  # read by the patched trinity/explorer/proxy/app.py
TLS_CERT_VAR, TLS_KEY_VAR = "RFTSTACK_PROXY_TLS_CERT", "RFTSTACK_PROXY_TLS_KEY"


def ensure(job_dir: str | os.PathLike) -> tuple[Path, str, bool]:
    """(key file, key, made now): the key in ``job_dir``, made with mode 0600 when absent."""
    path = Path(job_dir) / FILE_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            raise UserError(f"the API key file {path} can be read by other users; run `chmod 600 {path}` and start again") from None
        key = path.read_text().strip()
        if not key:
            raise UserError(f"the API key file {path} is empty; remove it and start again to make a new key")
        return path, key, False
    except OSError as exc:
        raise UserError(f"cannot write the API key file {path} ({exc.strerror}); make {path.parent} writable") from None
    key = "rfts-" + secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path, key, True


def check_tls(cert: str | None, key: str | None) -> None:
    """--tls-cert and --tls-key come together and name readable files."""
    if bool(cert) != bool(key):
        raise UserError("--tls-cert and --tls-key go together; pass both (the certificate and its private key, PEM)")
    for flag, p in (("--tls-cert", cert), ("--tls-key", key)):
        if p and not os.access(p, os.R_OK):
            raise UserError(f"{flag} {p} is not a readable file; pass the PEM file's path")


def proxy_env(key_file: Path | None, cert: str | None, tls_key: str | None) -> dict[str, str]:
    """The variables the patched proxy reads (paths only)."""
    env = {}
    if key_file is not None:
        env[KEY_FILE_VAR] = str(Path(key_file).absolute())
    if cert:
        env[TLS_CERT_VAR], env[TLS_KEY_VAR] = str(Path(cert).absolute()), str(Path(tls_key).absolute())
    return env


def client_lines(base_url: str, key: str) -> list[str]:
    """Ready-to-paste lines for a client (shown once, on the terminal only)."""
    return [
        f"export OPENAI_BASE_URL={base_url}/v1 OPENAI_API_KEY={key}",
        f"curl -s {base_url}/v1/models -H 'Authorization: Bearer {key}'",
    ]
