"""A forward HTTP proxy on loopback for the test bed: every absolute-URI request (`GET http://any-host/
path`) is answered from one upstream server on 127.0.0.1, whatever host it names. With apt's
`Acquire::http::Proxy` pointing here and the repository named by a host the container cannot reach,
only a client that really goes through apt's proxy gets an answer. It never connects anywhere but the
upstream on loopback."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    upstream: str            # "http://127.0.0.1:PORT"
    seen: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.0"

    def _forward(self, head: bool) -> None:
        parts = urllib.parse.urlsplit(self.path)
        if not parts.scheme:   # not a proxy request (a direct GET): refuse it
            self.send_error(400, "proxy requests only")
            return
        self.server.seen.append(f"{self.command} {self.path}")
        target = self.server.upstream + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = urllib.request.Request(target, method="HEAD" if head else "GET")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never another proxy
        try:
            with opener.open(request, timeout=30) as response:
                body = response.read()
                status, headers = response.status, response.headers
        except urllib.error.HTTPError as error:
            body, status, headers = error.read(), error.code, error.headers
        self.send_response(status)
        for name in ("Content-Type", "Last-Modified"):
            if headers.get(name):
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._forward(head=False)

    def do_HEAD(self) -> None:
        self._forward(head=True)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class HttpProxy:
    upstream: str
    host: str = "127.0.0.1"
    port: int = 0
    _server: _ProxyServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def seen(self) -> list[str]:
        """Every proxied request, "GET http://host/path", in arrival order."""
        return self._server.seen if self._server else []

    def start(self) -> HttpProxy:
        if not self.upstream.startswith("http://127."):
            raise ValueError(f"the test proxy forwards to loopback only, not {self.upstream}")
        server = _ProxyServer((self.host, self.port), _Handler)
        server.upstream, server.seen = self.upstream.rstrip("/"), []
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
