import http.server
import json
import threading

from rftstack.run import readiness


def test_last_meaningful_skips_colour_blank_and_rulers():
    lines = ["INFO loading weights", "\x1b[36m(pid=12) INFO engine up\x1b[0m", "", "=" * 40, "   "]
    assert readiness.last_meaningful(lines) == "(pid=12) INFO engine up"
    assert readiness.last_meaningful([]) is None
    assert readiness.last_meaningful(["x" * 500], width=20) == "x" * 17 + "..."


def test_curl_example_is_valid_shell_and_json():
    import shlex

    cmd = readiness.curl_example("http://127.0.0.1:8010", "it's/model")
    parts = shlex.split(cmd)
    body = json.loads(parts[parts.index("-d") + 1])
    assert body["model"] == "it's/model" and parts[2] == "http://127.0.0.1:8010/v1/chat/completions"


def test_check_against_a_real_server():
    state = {"ready": False}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = state["ready"]
            code = 200 if ok or self.path == "/health" else 503
            body = {"data": [{"id": "m"}]} if self.path == "/v1/models" and ok else {}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        r = readiness.check(base)
        assert r.health and not r.ok and "503" in r.detail
        state["ready"] = True
        assert readiness.check(base).models == ["m"]
    finally:
        srv.shutdown()
    r = readiness.check(base, timeout=1)
    assert not r.ok and not r.health
