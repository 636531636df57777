"""Fetch one file over HTTP(S) onto the controller, bounded in time and size: upstream's release wheels.

The controller downloads, not the targets (docs/extensions.md, "Upstream's release wheels"): the cache it
fills lives here, one download serves every target of a key, the sha256 is taken where the bytes land, and
targets in an air-gapped network need no route, proxy or credentials of their own.

Nothing here may hang an apply. Name resolution runs under the same deadline as the connection (a resolver
that does not answer would otherwise block for as long as the C library likes), every socket operation
has a timeout, and a host that could not be reached is remembered for the rest of the run: only its first
try costs a timeout, every later wheel of the run is told at once and the caller builds. Until a host has
answered once, one try at a time goes to it (targets of different keys ask at the same moment): the others
wait for that try's outcome instead of each paying the timeout. A loopback URL never goes through a proxy
from the environment (the tests' stand-in for GitHub is one).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import ipaddress
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

DEFAULT_TIMEOUT = 10.0  # seconds: resolving, connecting, and each read
_CHUNK = 1 << 20


class FetchError(Exception):
    """Why a file was not fetched. unreachable: the host did not answer at all (not: it said 404)."""

    def __init__(self, reason: str, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.unreachable = reason, unreachable


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    size: int
    sha256: str


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Follow redirects (GitHub sends release assets on to its object store), never from https to http."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if req.full_url.startswith("https:") and not newurl.startswith("https:"):
            raise urllib.error.HTTPError(req.full_url, code, f"refused redirect to {newurl}", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(parts: urllib.parse.SplitResult) -> str:
    return f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class Fetcher:
    """Downloads for one run; shared by every target's thread (the unreachable hosts are one set)."""

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._unreachable: dict[str, str] = {}  # origin -> why
        self._answered: set[str] = set()  # origins that sent an HTTP answer (even a 404) in this run
        self._gates: dict[str, threading.Lock] = {}  # origin -> held by the one try at an unproven origin
        self._refused: dict[str, str] = {}  # URL -> why it is not to be used again in this run

    def refuse(self, url: str, reason: str) -> None:
        """url gave something unusable (a wheel that did not install or import): do not fetch it again."""
        with self._lock:
            self._refused[url] = reason

    def fetch(self, url: str, dest: Path, *, max_bytes: int) -> Fetched:
        """Stream url into dest (created 0600, exclusively), hashing as it arrives; dest is removed on
        failure."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(f"not an http(s) URL: {url}")
        origin = _origin(parts)
        with self._lock:
            refused = self._refused.get(url)
            # Only the connection is gated, never the body: once the host has answered, downloads of
            # different keys run side by side.
            gate = None if origin in self._answered else self._gates.setdefault(origin, threading.Lock())
        if refused:
            raise FetchError(f"{refused} (earlier in this run)")
        try:
            with gate or contextlib.nullcontext():
                response = self._connect(url, parts.hostname, parts.port or 0, origin)
            with response:
                return self._stream(response, url, dest, max_bytes)
        except FetchError:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
            raise

    def _connect(self, url: str, host: str, port: int, origin: str) -> http.client.HTTPResponse:
        """The response to url, headers read; the outcome for its origin is remembered before the gate
        opens, so whoever waited on it is answered from memory when the host did not answer."""
        with self._lock:
            unreachable = self._unreachable.get(origin)
        if unreachable:
            raise FetchError(f"{unreachable} (earlier in this run)", unreachable=True)
        try:
            self._resolve(host, port)
            response = self._open(url, host)
        except FetchError as error:
            with self._lock:
                if error.unreachable:
                    self._unreachable[origin] = error.reason
                else:  # an HTTP error status: the host is there
                    self._answered.add(origin)
            raise
        with self._lock:
            self._answered.add(origin)
        return response

    def _resolve(self, host: str, port: int) -> None:
        """getaddrinfo under the deadline: it takes no timeout of its own. A resolver that has not
        answered by then is left to finish in its daemon thread; its answer is not needed any more."""
        outcome: list[BaseException | None] = []

        def resolve() -> None:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                outcome.append(None)
            except OSError as error:
                outcome.append(error)

        worker = threading.Thread(target=resolve, name=f"resolve {host}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if not outcome:
            raise FetchError(f"resolving {host} took over {self.timeout:g} s", unreachable=True)
        if outcome[0] is not None:
            raise FetchError(f"cannot resolve {host}: {outcome[0]}", unreachable=True)

    def _open(self, url: str, host: str) -> http.client.HTTPResponse:
        handlers: list[urllib.request.BaseHandler] = [_NoDowngrade()]
        if _is_loopback(host):
            handlers.append(urllib.request.ProxyHandler({}))
        opener = urllib.request.build_opener(*handlers)
        request = urllib.request.Request(url, headers={"User-Agent": "fleetfix",
                                                       "Accept": "application/octet-stream"})
        try:
            response: http.client.HTTPResponse = opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:  # the host answered: reachable, but no file for us
            error.close()
            raise FetchError(f"HTTP {error.code} {error.reason} for {url}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            raise FetchError(f"cannot reach {host}: {reason}", unreachable=True) from None
        return response

    def _stream(self, response: http.client.HTTPResponse, url: str, dest: Path, max_bytes: int) -> Fetched:
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url} is {length} bytes, over the limit of {max_bytes}")
        digest, size = hashlib.sha256(), 0
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as sink:
            try:
                while chunk := response.read(_CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise FetchError(f"{url} sent over {max_bytes} bytes")
                    digest.update(chunk)
                    sink.write(chunk)
            except (OSError, http.client.HTTPException) as error:
                raise FetchError(f"download of {url} broke off after {size} bytes: {error}") from None
            sink.flush()
            os.fsync(sink.fileno())
        if length is not None and length.isdigit() and int(length) != size:
            raise FetchError(f"{url}: {size} bytes arrived, Content-Length said {length}")
        return Fetched(response.geturl(), size, digest.hexdigest())
