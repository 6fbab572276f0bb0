"""The supervisor's health check of a server-flow job goes straight to loopback, never through a proxy from the
host's environment (an http_proxy there made the check fail, so the job would time out waiting)."""
import http.server
import threading

from remote_ops.agent.job import supervisor


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):          # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_health_check_ignores_a_proxy_in_the_environment(monkeypatch):
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        # a proxy that answers nothing (port 9, discard), and loopback not exempted
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        monkeypatch.setenv("no_proxy", "")
        monkeypatch.setenv("NO_PROXY", "")
        server = supervisor.Server.__new__(supervisor.Server)
        server.spec = {"port": srv.server_address[1], "health_path": "/health"}
        assert server.healthy() is True
        server.spec = {"port": srv.server_address[1], "health_path": "/missing"}
        assert server.healthy() is False
    finally:
        srv.shutdown()
