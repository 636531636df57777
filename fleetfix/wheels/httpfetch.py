"""Fetch one file over HTTPS onto the controller, authenticated, bounded in time and size: upstream's
release wheels.

The controller downloads, not the targets (docs/extensions.md, "Upstream's release wheels"): the cache it
fills lives here, one download serves every target of a key, the sha256 is taken where the bytes land, and
targets in an air-gapped network need no route, proxy or credentials of their own.

**Authenticated.** Before a byte is asked for, the fetcher's `Authenticator` names the sha256 the file must
have (GitHub's API `digest`, or the operator's wheel lock: `releasewheels.ReleaseDigests`). The bytes are
hashed as they arrive into a private file the caller cannot install from, and a file whose digest differs
is removed before `fetch` returns. A file nobody published a digest for is refused unless the operator
opted in (`allow_unverified`). The scheme is compared without regard to case (`HTTPS://` is https): https
only, and plain http only for a file whose digest the operator pinned, since then the digest, not the
transport, authenticates it. A redirect that leaves https is refused.

**Bounded.** Nothing here may hang an apply. Every download has a total deadline, whatever phase it is in
(resolving, connecting, TLS, headers, body): a watchdog shuts its sockets down when the deadline passes,
and the body is read one socket read at a time (`read1`), so a server sending a byte just inside each read
timeout cannot stretch one `read()` for ever. Name resolution runs under the same deadline as the
connection (a resolver that does not answer would otherwise block for as long as the C library likes),
every socket operation has a timeout, and a host that could not be reached, or ran past the deadline, is
remembered for the rest of the run: only its first try costs, every later wheel of the run is told at once
and the caller builds. Until a host has answered once, one try at a time goes to it (targets of different
keys ask at the same moment): the others wait for that try's outcome instead of each paying the timeout.
A loopback URL never goes through a proxy from the environment (the tests' stand-in for GitHub is one).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import ipaddress
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

DEFAULT_TIMEOUT = 10.0  # seconds: resolving, connecting, and each read
# seconds: the whole of one download. A 4 GiB wheel (the size limit) needs ~5 MB/s to make it; upstream's
# largest wheels are a few hundred MB.
DEFAULT_DEADLINE = 900.0
_CHUNK = 1 << 20


class FetchError(Exception):
    """Why a file was not fetched. unreachable: the host did not answer at all (not: it said 404), or
    answered too slowly to finish within the deadline: either way, not worth asking again in this run."""

    def __init__(self, reason: str, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.unreachable = reason, unreachable


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    size: int
    sha256: str
    verified_by: str  # where the sha256 it matched came from; "" when fetched unverified (opted in)


@dataclass(frozen=True)
class Expected:
    """The sha256 a file must have, and who says so."""

    sha256: str  # lower-case hex
    source: str  # for messages: "GitHub's API", "wheels.lock:12"
    pinned: bool = False  # the operator's own pin (a wheel lock): authenticates even a plain-http mirror
    size: int | None = None  # the exact size, where the source says it: more is refused as it arrives


class Authenticator(Protocol):
    def expected(self, url: str, fetcher: Fetcher) -> Expected | str:
        """The digest url must match, or why there is none."""
        ...


def scheme_of(url: str) -> str:
    """The URL's scheme, lower-cased: RFC 3986 section 3.1 makes schemes case-insensitive."""
    return urllib.parse.urlsplit(url).scheme.lower()


class _KeepHttps(urllib.request.HTTPRedirectHandler):
    """Follow redirects (GitHub sends release assets on to its object store), never from https to anything
    else: the comparison ignores case, so `HTTPS://` is held to it too."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if scheme_of(req.full_url) == "https" and scheme_of(newurl) != "https":
            fp.close()
            raise _Downgrade(f"refused a redirect from https to {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Downgrade(Exception):
    pass


class _Watchdog:
    """Shuts a download's sockets down once its deadline has passed, whatever it is waiting for: a blocked
    read then returns at once. A socket is registered as it is created, before TLS or any byte."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(base: type[http.client.HTTPConnection], watchdog: _Watchdog) -> Callable[..., Any]:
    """A connection class like base whose sockets the watchdog knows of from their creation."""

    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        connection = base(*args, **kwargs)
        create = connection._create_connection  # type: ignore[attr-defined]

        def create_watched(*a: Any, **k: Any) -> socket.socket:
            sock: socket.socket = create(*a, **k)
            watchdog.watch(sock)
            return sock

        connection._create_connection = create_watched  # type: ignore[attr-defined]
        return connection

    return make


class _WatchedHttp(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self._watchdog), req)


class _WatchedHttps(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self._watchdog), req,
                            context=self._context)  # type: ignore[attr-defined]


def is_loopback(host: str) -> bool:
    """Whether host names this machine (localhost or a loopback address): where plain http is allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(parts: urllib.parse.SplitResult) -> str:
    scheme = parts.scheme.lower()
    return f"{scheme}://{parts.hostname}:{parts.port or (443 if scheme == 'https' else 80)}"


class Fetcher:
    """Downloads for one run; shared by every target's thread (the unreachable hosts are one set).

    authenticator: names the sha256 of each URL before it is fetched (None: no file has one).
    allow_unverified: fetch a file nobody published a digest for anyway (over https only); the operator's
    explicit choice, never a default.
    inspect: why a fetched file is unusable before anyone opens it (a wheel that unpacks to terabytes),
    or None; such a file is removed like one whose digest differs.
    """

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT, deadline: float = DEFAULT_DEADLINE,
                 authenticator: Authenticator | None = None, allow_unverified: bool = False,
                 inspect: Callable[[Path], str | None] | None = None) -> None:
        self.timeout, self.deadline = timeout, deadline
        self.authenticator, self.allow_unverified, self.inspect = authenticator, allow_unverified, inspect
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
        """Stream url into dest (created 0600, exclusively), hashing as it arrives, and check the hash
        against the digest the authenticator names; dest is removed on any failure."""
        with self._lock:
            refused = self._refused.get(url)
        if refused:
            raise FetchError(f"{refused} (earlier in this run)")
        expected = self._expected(url)
        if expected is not None and expected.size is not None:
            if expected.size > max_bytes:
                raise FetchError(f"{url} is {expected.size} bytes ({expected.source}), over the limit of "
                                 f"{max_bytes}")
            max_bytes = expected.size
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as sink:
                size, sha256, final = self._download(url, sink.write, max_bytes,
                                                     allow_http=expected is not None and expected.pinned,
                                                     accept="application/octet-stream")
                sink.flush()
                os.fsync(sink.fileno())
            if expected is not None and sha256 != expected.sha256:
                raise self._refuse(url, f"{url}: sha256 {sha256} is not {expected.sha256} "
                                        f"({expected.source}); removed")
            problem = self.inspect(dest) if self.inspect is not None else None
            if problem is not None:
                raise self._refuse(url, f"{url.rpartition('/')[2]} refused: {problem}; removed")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()
            raise
        return Fetched(final, size, sha256, expected.source if expected is not None else "")

    def _refuse(self, url: str, reason: str) -> FetchError:
        """The error for a file that arrived and is not the one wanted; url is not fetched again."""
        self.refuse(url, reason)
        return FetchError(reason)

    def get(self, url: str, *, max_bytes: int, accept: str = "application/json") -> bytes:
        """url's body in memory (an API's answer): https only, under the same bounds as a download."""
        buffer = io.BytesIO()
        self._download(url, buffer.write, max_bytes, allow_http=False, accept=accept)
        return buffer.getvalue()

    def _expected(self, url: str) -> Expected | None:
        """The digest url must match; None only where the operator allowed unverified files."""
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(f"not an https URL: {url}")
        found = "no digest source" if self.authenticator is None else self.authenticator.expected(url, self)
        if isinstance(found, Expected) and (found.pinned or scheme == "https"):
            return found
        if scheme == "http":
            raise FetchError(f"refused plain http for {url}: https only, unless the file's sha256 is "
                             "pinned in a wheel lock")
        if self.allow_unverified:
            return None
        raise FetchError(f"no sha256 to check {url.rpartition('/')[2]} against ({found}); not fetched: pin "
                         "it in a wheel lock (--wheel-lock), or --allow-unverified-wheels")

    def _download(self, url: str, write: Callable[[bytes], object], max_bytes: int, *,
                  allow_http: bool, accept: str) -> tuple[int, str, str]:
        """(size, sha256, final URL) of url's body, each chunk handed to write as it arrives."""
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise FetchError(f"not an https URL: {url}")
        if scheme == "http" and not allow_http:
            raise FetchError(f"refused plain http for {url}: https only, unless the file's sha256 is "
                             "pinned in a wheel lock")
        origin = _origin(parts)
        with self._lock:
            gate = None if origin in self._answered else self._gates.setdefault(origin, threading.Lock())
        with _Watchdog(self.deadline) as watchdog:
            try:
                # Only the connection is gated, never the body: once the host has answered, downloads of
                # different keys run side by side.
                request = urllib.request.Request(url, headers={"User-Agent": "fleetfix", "Accept": accept})
                with gate or contextlib.nullcontext():
                    response = self._connect(request, parts.port or 0, origin, watchdog)
                with response:
                    return self._stream(response, url, write, max_bytes, watchdog)
            except FetchError as error:
                if watchdog.fired or watchdog.left() <= 0:
                    late = FetchError(f"{url} took over the download deadline of {self.deadline:g} s",
                                      unreachable=True)
                    with self._lock:
                        self._unreachable[origin] = late.reason
                    raise late from None
                raise error

    def _connect(self, request: urllib.request.Request, port: int, origin: str,
                 watchdog: _Watchdog) -> http.client.HTTPResponse:
        """The response to request, headers read; the outcome for its origin is remembered before the gate
        opens, so whoever waited on it is answered from memory when the host did not answer."""
        with self._lock:
            unreachable = self._unreachable.get(origin)
        if unreachable:
            raise FetchError(f"{unreachable} (earlier in this run)", unreachable=True)
        host = urllib.parse.urlsplit(request.full_url).hostname or ""
        try:
            self._resolve(host, port, watchdog)
            response = self._open(request, host, watchdog)
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

    def _resolve(self, host: str, port: int, watchdog: _Watchdog) -> None:
        """getaddrinfo under the deadline: it takes no timeout of its own. A resolver that has not
        answered by then is left to finish in its daemon thread; its answer is not needed any more."""
        outcome: list[BaseException | None] = []

        def resolve() -> None:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                outcome.append(None)
            except OSError as error:
                outcome.append(error)

        limit = max(0.0, min(self.timeout, watchdog.left()))
        worker = threading.Thread(target=resolve, name=f"resolve {host}", daemon=True)
        worker.start()
        worker.join(limit)
        if not outcome:
            raise FetchError(f"resolving {host} took over {limit:g} s", unreachable=True)
        if outcome[0] is not None:
            raise FetchError(f"cannot resolve {host}: {outcome[0]}", unreachable=True)

    def _open(self, request: urllib.request.Request, host: str,
              watchdog: _Watchdog) -> http.client.HTTPResponse:
        handlers: list[urllib.request.BaseHandler] = [_KeepHttps(), _WatchedHttp(watchdog),
                                                      _WatchedHttps(watchdog)]
        if is_loopback(host):
            handlers.append(urllib.request.ProxyHandler({}))
        opener = urllib.request.build_opener(*handlers)
        url = request.full_url
        try:
            response: http.client.HTTPResponse = opener.open(
                request, timeout=max(0.001, min(self.timeout, watchdog.left())))
        except _Downgrade as refused:
            raise FetchError(f"{url}: {refused}") from None
        except urllib.error.HTTPError as error:  # the host answered: reachable, but no file for us
            error.close()
            raise FetchError(f"HTTP {error.code} {error.reason} for {url}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, _Downgrade):
                raise FetchError(f"{url}: {reason}") from None
            raise FetchError(f"cannot reach {host}: {reason}", unreachable=True) from None
        return response

    def _stream(self, response: http.client.HTTPResponse, url: str, write: Callable[[bytes], object],
                max_bytes: int, watchdog: _Watchdog) -> tuple[int, str, str]:
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url} is {length} bytes, over the limit of {max_bytes}")
        digest, size = hashlib.sha256(), 0
        try:
            # read1: at most one socket read per call, so the deadline is looked at between reads.
            while chunk := response.read1(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f"{url} sent over {max_bytes} bytes")
                if watchdog.left() <= 0:
                    raise FetchError(f"{url} is past its deadline")
                digest.update(chunk)
                write(chunk)
        except (OSError, http.client.HTTPException) as error:
            raise FetchError(f"download of {url} broke off after {size} bytes: {error}") from None
        if watchdog.fired:  # the watchdog's shutdown reads as the end of a body without a length
            raise FetchError(f"{url} is past its deadline")
        if length is not None and length.isdigit() and int(length) != size:
            raise FetchError(f"{url}: {size} bytes arrived, Content-Length said {length}")
        return size, digest.hexdigest(), response.geturl()
