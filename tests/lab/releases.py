"""A stand-in for GitHub's release downloads on 127.0.0.1, and wheels to serve from it.

`ReleaseServer` answers GET for the paths it was given (the bytes, with Content-Length), a 302 for the
paths in `redirects`, and 404 for everything else, and counts every request per path, so a test can say
"downloaded exactly once" and "asked for this key's wheel, got nothing". With `tls` (tests/lab/tlsca.py) it
speaks HTTPS. `github_api(files)` gives the documents GitHub Enterprise Server's REST API would answer for
those files' releases (GET /api/v3/repos/OWNER/REPO/releases/tags/TAG, each asset with its name, size and
`digest` "sha256:<hex>"), to be served by the same stand-in. `refused_port()` is a loopback port where
nothing listens: a socket bound there and never listening, so a connection is refused at once and no other
process can take the port while the test runs. No traffic leaves loopback.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import io
import json
import re
import socket
import threading
import zipfile
from collections.abc import Collection, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.lab.tlsca import TestCA

_DOWNLOAD = re.compile(
    r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+)/releases/download/(?P<tag>[^/]+)/(?P<file>[^/]+)$")


def github_api(files: Mapping[str, bytes], *, without_digest: Collection[str] = ()) -> dict[str, bytes]:
    """{API path: release JSON} for every release among files' paths; the paths in without_digest get
    `"digest": null`, as assets uploaded before GitHub computed digests have."""
    releases: dict[str, list[dict[str, object]]] = {}
    for path, body in files.items():
        found = _DOWNLOAD.match(path)
        if found is None:
            continue
        api = f"/api/v3/repos/{found['owner']}/{found['repo']}/releases/tags/{found['tag']}"
        digest = None if path in without_digest else f"sha256:{hashlib.sha256(body).hexdigest()}"
        releases.setdefault(api, []).append({"name": found["file"], "size": len(body), "digest": digest,
                                             "state": "uploaded"})
    return {api: json.dumps({"tag_name": api.rpartition("/")[2], "assets": assets}).encode()
            for api, assets in releases.items()}


class ReleaseServer:
    def __init__(self, files: Mapping[str, bytes] | None = None, *, tls: TestCA | None = None,
                 redirects: Mapping[str, str] | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.redirects = dict(redirects or {})
        self.requests: collections.Counter[str] = collections.Counter()
        self.accepts: dict[str, str | None] = {}  # path -> the Accept header of its last request
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server._lock:
                    server.requests[self.path] += 1
                    server.accepts[self.path] = self.headers.get("Accept")
                    body = server.files.get(self.path)
                    location = server.redirects.get(self.path)
                if location is not None:
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if tls is not None:
            self._http.socket = tls.server_context().wrap_socket(self._http.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._http.serve_forever, name="release-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"

    def __enter__(self) -> ReleaseServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A 127.0.0.1 port bound by this process and not listening: connecting there is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(dist: str, version: str, tag: str, files: Mapping[str, str | bytes], *,
               metadata_version: str | None = None) -> bytes:
    """A wheel as bdist_wheel writes one: the files, then dist-info METADATA, WHEEL (with its Tag) and
    RECORD. metadata_version: what METADATA says (default: version; upstream's is always the plain one)."""
    info = f"{dist}-{version}.dist-info"
    members = {path: data.encode() if isinstance(data, str) else data for path, data in files.items()}
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\n"
                                   f"Version: {metadata_version or version}\n").encode()
    members[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: fleetfix-tests\nRoot-Is-Purelib: false\n"
                                f"Tag: {tag}\n").encode()
    record = [_record_line(path, data) for path, data in members.items()] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in members.items():
            wheel.writestr(path, data)
    return buffer.getvalue()
