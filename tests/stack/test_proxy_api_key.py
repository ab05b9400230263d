"""`rftstack serve --expose`: Trinity's real proxy app (every trinity-rft patch of the policy, the
api-key patch last) asks for `Authorization: Bearer <key>` on every route, answers a missing or
wrong key with a 401 that records nothing, and serves HTTPS with a user's certificate; the key is in
no file but its own. Upstream is the vLLM TEST DOUBLE of test_proxy_stream.py, the Explorer behind
/commit the JSON-lines TEST DOUBLE of tests/doubles/trinity_proxy_host.py. Also the key file itself
(rftstack.apikey) and serve's refusals."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import stat
import subprocess
import sys

import httpx
import pytest

from rftstack.run import apikey
from rftstack.errors import UserError
from proxy_helpers import DOUBLES, Proxy, free_port

WRONG = "rfts-not-the-key"


def self_signed(d) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (PEM), made with `cryptography`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    c, k = d / "cert.pem", d / "key.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(c), str(k)


def routes(client: httpx.Client, base: str, headers: dict, msg_id: str) -> dict[str, httpx.Response]:
    chat = {"model": "m", "messages": [{"role": "user", "content": "key test"}], "max_tokens": 3}
    return {
        "GET /health": client.get(base + "/health", headers=headers),
        "GET /v1/models": client.get(base + "/v1/models", headers=headers),
        "GET /metrics": client.get(base + "/metrics", headers=headers),
        "POST /v1/chat/completions": client.post(base + "/v1/chat/completions", json=chat, headers=headers),
        "POST /v1/chat/completions stream": client.post(base + "/v1/chat/completions", json={**chat, "stream": True}, headers=headers),
        "POST /feedback": client.post(base + "/feedback", json={"reward": 1.0, "msg_ids": [msg_id], "task_id": "k", "run_id": 0}, headers=headers),
        "POST /commit": client.post(base + "/commit", json={}, headers=headers),
    }


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_every_route_asks_for_the_key_and_a_refused_request_records_nothing(double, policy_site, tmp_path, monkeypatch, tls):
    key_file, key, made = apikey.ensure(tmp_path / "job")
    assert made
    cert = tls_key = None
    if tls:
        cert, tls_key = self_signed(tmp_path)
    for k, v in apikey.proxy_env(key_file, cert, tls_key).items():
        monkeypatch.setenv(k, v)  # what the proxy's process inherits from serve's Ray head
    scheme = "https" if tls else "http"
    px = None
    try:
        px = _keyed_proxy(double, tmp_path, policy_site, cert, key)
        base = f"{scheme}://127.0.0.1:{px.port}"
        with httpx.Client(verify=cert if tls else True, timeout=60) as c:
            sent_before = len(double.sent)
            for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": key}):
                got = routes(c, base, headers, "none")
                for route, r in got.items():
                    assert r.status_code == 401, (route, headers, r.status_code)
                    err = r.json()["error"]
                    assert err["type"] == "authentication_error" and err["message"].count(".") <= 1 and "Bearer" in err["message"]
                    assert key not in r.text
            assert len(double.sent) == sent_before and px.rows() == []  # nothing reached vLLM, nothing recorded
            right = {"Authorization": f"Bearer {key}"}
            first = c.post(base + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}, headers=right)
            assert first.status_code == 200
            got = routes(c, base, right, first.json()["id"])
            assert {route: r.status_code for route, r in got.items()} == dict.fromkeys(got, 200)
        assert len(px.rows()) == 3 and first.json()["id"] in px.rows()
        assert [json.loads(line)["msg_id"] for line in px.commits.read_text().splitlines()] == [first.json()["id"]]
    finally:
        if px is not None:
            px.stop()
    # the key is in its own file and nowhere else (the proxy's log, its database, the commits)
    found = [p for p in tmp_path.rglob("*") if p.is_file() and p != key_file and key.encode() in p.read_bytes()]
    assert found == []


def _keyed_proxy(double, tmp_path, site, cert, key):
    """The proxy host of test_proxy_stream.Proxy, waited for with the key (and over https with
    ``cert``); Proxy's own wait sends no key."""
    import socket
    import time

    class Keyed:
        pass

    px = Keyed()
    work = tmp_path / "proxy"
    work.mkdir()
    px.db, px.commits, px.log, px.port = work / "proxy_history.db", work / "commits.jsonl", work / "proxy.log", free_port()
    cmd = [sys.executable, str(DOUBLES / "trinity_proxy_host.py"), "--upstream", double.base_url, "--port", str(px.port),
           "--db", str(px.db), "--commits", str(px.commits), "--trinity-site", str(site)]
    px.proc = subprocess.Popen(cmd, stdout=open(px.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + 300
    while True:
        assert px.proc.poll() is None, px.log.read_text()[-3000:]
        try:
            with httpx.Client(verify=cert or True, timeout=2) as c:
                if c.get(f"{'https' if cert else 'http'}://127.0.0.1:{px.port}/health", headers={"Authorization": f"Bearer {key}"}).status_code == 200:
                    break
        except (httpx.HTTPError, socket.error):
            assert time.monotonic() < end
            time.sleep(0.3)
    px.rows = lambda: Proxy.rows(px)
    px.stop = lambda: Proxy.stop(px)
    return px


def test_key_file_is_made_once_0600_and_kept(tmp_path):
    path, key, made = apikey.ensure(tmp_path / "job")
    assert made and stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) > 40
    assert apikey.ensure(tmp_path / "job") == (path, key, False)  # a restart keeps it
    os.chmod(path, 0o644)
    with pytest.raises(UserError, match="chmod 600"):
        apikey.ensure(tmp_path / "job")


def test_tls_flags_go_together(tmp_path):
    with pytest.raises(UserError, match="go together"):
        apikey.check_tls(str(tmp_path / "c.pem"), None)
    with pytest.raises(UserError, match="not a readable file"):
        apikey.check_tls(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    apikey.check_tls(None, None)


@pytest.mark.parametrize("argv,says", [
    (["--expose", "--ray-address", "127.0.0.1:1", "--ray-token-path", "/nonexistent"], "--expose needs this serve's own Ray head"),
    (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
])
def test_serve_refuses_what_cannot_carry_the_key(tmp_path, tiny_model, argv, says):
    from rftstack.run import report_config

    cfg = report_config.write(tmp_path / "c.yaml", tiny_model, max_model_len=2048, checkpoint_root_dir=tmp_path / "ckpt")
    r = subprocess.run([sys.executable, "-m", "rftstack", "serve", "--skip-doctor", "-c", str(cfg), "--run-dir", str(tmp_path / "run"), *argv],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stdout + r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "ray").exists()
    assert not list((tmp_path).rglob(apikey.FILE_NAME))


def test_serve_expose_makes_the_key_once_and_keeps_it_out_of_its_files(tmp_path, serve_runner):
    """Two `rftstack serve --expose` on the same checkpoint root (trinity is the fake_trinity TEST
    DOUBLE: the real proxy's side is tested above): the first makes the key and shows it once on
    the terminal with client lines, the second says it is kept and does not show it; the key is in
    no file of either run directory or the checkpoint root other than its own."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"mode: serve\nmodel:\n  model_path: /models/m\ncluster: {{node_num: 1, gpu_per_node: 1}}\n"
                   f"checkpoint_root_dir: {tmp_path / 'data'}\nexplorer: {{}}\n")
    texts = []
    for _ in range(2):
        run = serve_runner(["--skip-doctor", "--expose", "--port", "0", "--num-gpus", "0", "-c", str(cfg)])
        assert run.wait_event("ready", timeout=400), (run.finish(), run.stderr_text())
        run.proc.send_signal(2)
        assert run.finish() == 0
        texts.append(run.stderr)
    (key_file,) = list((tmp_path / "data").rglob(apikey.FILE_NAME))
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert texts[0].count(key) == 2 and f"OPENAI_API_KEY={key}" in texts[0] and f"Authorization: Bearer {key}" in texts[0]
    assert key not in texts[1] and "kept from the first start" in texts[1]
    files = [p for d in (tmp_path / "run0", tmp_path / "run1", tmp_path / "data") for p in d.rglob("*")
             if p.is_file() and not p.is_symlink() and p != key_file]
    assert len(files) > 5 and [p for p in files if key.encode() in p.read_bytes()] == []
