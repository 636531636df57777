"""Trust across guests, upstream's release wheels: authenticated by a digest, https only, bounded in time.

Before: a plain `http://` mirror was fetched with no integrity check; `HTTPS://` (upper case) let a redirect
to http through; GitHub's `digest` for each release asset was ignored, so a wheel without any digest was
installed; and a server trickling a byte just inside each read timeout held a download (and the key's build
lock) for as long as it liked; a wheel was opened whatever it declared it unpacks to. Every test here talks
to loopback stand-ins only.
"""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetfix.wheels import archive as wheelarchive
from fleetfix.wheels.httpfetch import Fetcher, FetchError
from fleetfix.wheels.lock import load_wheel_lock
from fleetfix.wheels.release import ReleaseDigests, parse_release, release_api_url
from tests.lab.releases import ReleaseServer, github_api
from tests.lab.tlsca import TestCA

NAME = "causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
ASSET = f"/Dao-AILab/causal-conv1d/releases/download/v1.6.1/{NAME}"
BODY = b"the release wheel's bytes " * 500
RELEASE_API = "/repos/Dao-AILab/causal-conv1d/releases/tags/v1.6.1"


def lock_for(tmp_path: Path, pins: dict[str, bytes]) -> ReleaseDigests:
    """A wheel lock file pinning each URL to the sha256 of the bytes given, loaded as an operator's is."""
    lines = ["wheels:", "  causal-conv1d:"] + [f"    {url}: sha256:{hashlib.sha256(body).hexdigest()}"
                                                for url, body in pins.items()]
    path = tmp_path / "wheels.lock"
    path.write_text("\n".join(lines) + "\n")
    return ReleaseDigests(load_wheel_lock(path))


# --- https only ---------------------------------------------------------------------------------------


def test_plain_http_is_refused_without_asking(tmp_path: Path) -> None:
    with ReleaseServer({ASSET: BODY}) as server:
        with pytest.raises(FetchError, match="refused plain http"):
            Fetcher(timeout=5).fetch(server.url + ASSET, tmp_path / "w.whl", max_bytes=10**6)
        with pytest.raises(FetchError, match="refused plain http"):  # the operator's opt-in is not this one
            Fetcher(timeout=5, allow_unverified=True).fetch(server.url.upper() + ASSET,
                                                            tmp_path / "w.whl", max_bytes=10**6)
        assert sum(server.requests.values()) == 0
    assert not list(tmp_path.iterdir())


def test_a_pinned_digest_authenticates_a_plain_http_mirror(tmp_path: Path) -> None:
    with ReleaseServer({ASSET: BODY, "/other" + ASSET: b"tampered " + BODY}) as server:
        fetcher = Fetcher(timeout=5, authenticator=lock_for(tmp_path, {server.url + ASSET: BODY,
                                                                       server.url + "/other" + ASSET: BODY}))
        got = fetcher.fetch(server.url + ASSET, tmp_path / "a.whl", max_bytes=10**6)
        assert (tmp_path / "a.whl").read_bytes() == BODY and got.verified_by.startswith("pinned at ")
        assert got.verified_by.endswith("wheels.lock:3")
        mismatch = r"sha256 [0-9a-f]{64} is not [0-9a-f]{64} \(pinned at .*wheels.lock:4"
        with pytest.raises(FetchError, match=mismatch):
            fetcher.fetch(server.url + "/other" + ASSET, tmp_path / "b.whl", max_bytes=10**6)
    assert not (tmp_path / "b.whl").exists()


def test_https_redirected_to_http_is_refused_whatever_the_case(tmp_path: Path, trusted_ca: TestCA) -> None:
    with ReleaseServer({ASSET: BODY}) as plain, \
            ReleaseServer({"/ok" + ASSET: BODY}, tls=trusted_ca,
                          redirects={ASSET: plain.url + ASSET, "/up" + ASSET: plain.url.upper() + ASSET,
                                     "/hop" + ASSET: "/ok" + ASSET}) as tls:
        fetcher = Fetcher(timeout=5, allow_unverified=True)
        mixed = tls.url.replace("https", "HtTpS")
        for url in (tls.url + ASSET, tls.url.upper() + ASSET, mixed + "/up" + ASSET):
            with pytest.raises(FetchError, match="refused a redirect from https to http"):
                fetcher.fetch(url, tmp_path / "w.whl", max_bytes=10**6)
        assert sum(plain.requests.values()) == 0
        # https to https (GitHub's hop to its object store) is followed
        got = fetcher.fetch(tls.url + "/hop" + ASSET, tmp_path / "w.whl", max_bytes=10**6)
        assert got.url == tls.url + "/ok" + ASSET and got.verified_by == ""
    assert (tmp_path / "w.whl").read_bytes() == BODY


# --- the digest GitHub publishes ------------------------------------------------------------------------


def test_the_api_digest_is_checked_before_the_file_is_kept(tmp_path: Path, trusted_ca: TestCA) -> None:
    good = ASSET
    swapped, longer = (ASSET.replace(name, f"{name}a") for name in ("causal_conv1d", "causal_conv1d"[:-1]))
    # The API describes BODY for all three; the server serves other bytes of the same size, and more bytes.
    api = github_api({good: BODY, swapped: BODY, longer: BODY})
    served = {good: BODY, swapped: BODY[::-1], longer: BODY + b"!", **api}
    with ReleaseServer(served, tls=trusted_ca) as server:
        fetcher = Fetcher(timeout=5, authenticator=ReleaseDigests())
        got = fetcher.fetch(server.url + good, tmp_path / "a.whl", max_bytes=10**6)
        assert got.sha256 == hashlib.sha256(BODY).hexdigest() and (tmp_path / "a.whl").read_bytes() == BODY
        release = "/api/v3/repos/Dao-AILab/causal-conv1d/releases/tags/v1.6.1"
        assert got.verified_by == f"the digest at {server.url}{release}"
        with pytest.raises(FetchError) as wrong:
            fetcher.fetch(server.url + swapped, tmp_path / "b.whl", max_bytes=10**6)
        assert f"is not {hashlib.sha256(BODY).hexdigest()} (the digest at" in wrong.value.reason
        assert wrong.value.reason.endswith("removed")
        with pytest.raises(FetchError, match="earlier in this run"):  # not downloaded again in this run
            fetcher.fetch(server.url + swapped, tmp_path / "b.whl", max_bytes=10**6)
        assert server.requests[swapped] == 1
        # the API gave the size too: a longer file is refused by its length before its bytes are kept
        with pytest.raises(FetchError, match=f"over the limit of {len(BODY)}"):
            fetcher.fetch(server.url + longer, tmp_path / "c.whl", max_bytes=10**6)
        assert server.requests[release] == 1  # one API request per release and run
        # asked as GitHub's reference recommends; the file as bytes
        assert server.accepts[release] == "application/vnd.github+json"
        assert server.accepts[good] == "application/octet-stream"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.whl"]


def test_an_asset_without_a_digest_is_not_fetched_unless_allowed(tmp_path: Path,
                                                                 trusted_ca: TestCA) -> None:
    files = {ASSET: BODY}
    with ReleaseServer({**files, **github_api(files, without_digest=[ASSET])}, tls=trusted_ca) as server:
        with pytest.raises(FetchError) as refused:
            Fetcher(timeout=5, authenticator=ReleaseDigests()).fetch(server.url + ASSET, tmp_path / "a.whl",
                                                                     max_bytes=10**6)
        assert f"no sha256 to check {NAME} against (the release asset {NAME} has no sha256 digest" in (
            refused.value.reason)
        assert "--allow-unverified-wheels" in refused.value.reason
        assert server.requests[ASSET] == 0 and not (tmp_path / "a.whl").exists()
        # the operator's explicit opt-in: fetched, and says it was not verified
        got = Fetcher(timeout=5, authenticator=ReleaseDigests(), allow_unverified=True).fetch(
            server.url + ASSET, tmp_path / "a.whl", max_bytes=10**6)
        assert got.verified_by == "" and server.requests[ASSET] == 1


def test_no_digest_source_at_all_refuses(tmp_path: Path, trusted_ca: TestCA) -> None:
    with ReleaseServer({ASSET: BODY}, tls=trusted_ca) as server:
        with pytest.raises(FetchError, match="no digest source"):
            Fetcher(timeout=5).fetch(server.url + ASSET, tmp_path / "a.whl", max_bytes=10**6)
        with pytest.raises(FetchError, match=r"asking .*/api/v3/.*: HTTP 404"):  # no API there: no digest
            Fetcher(timeout=5, authenticator=ReleaseDigests()).fetch(server.url + ASSET, tmp_path / "a.whl",
                                                                     max_bytes=10**6)
        assert server.requests[ASSET] == 0


@pytest.mark.parametrize(("url", "api"), [
    (f"https://github.com{ASSET}", f"https://api.github.com{RELEASE_API}"),
    (f"HTTPS://GitHub.com{ASSET}", f"https://api.github.com{RELEASE_API}"),
    (f"https://ghe.example:8443{ASSET}", f"https://ghe.example:8443/api/v3{RELEASE_API}"),
    (f"https://mirror.example/github{ASSET}", None),  # not at the host's root: no API known
    ("https://github.com/a/b/archive/v1.whl", None),
])
def test_which_api_describes_a_release_download(url: str, api: str | None) -> None:
    assert release_api_url(url) == api


@pytest.mark.parametrize(("body", "found"), [
    (b'{"assets": [{"name": "a.whl", "size": 3, "digest": "sha256:' + b"ab" * 32 + b'"}]}',
     {"a.whl": ("ab" * 32, 3)}),
    (b'{"assets": [{"name": "a.whl", "digest": null}]}', {"a.whl": (None, None)}),
    (b'{"assets": [{"name": "a.whl", "digest": "md5:abc"}]}', {"a.whl": (None, None)}),
    (b'{"assets": [{"name": "a.whl", "digest": "sha256:' + b"AB" * 32 + b'"}]}', {"a.whl": (None, None)}),
    (b'{"message": "API rate limit exceeded"}', "the API's answer has no assets list"),
    (b"<html>", "the API's answer is not JSON"),
    (b"[" * 100_000, "the API's answer is not JSON (JSON nested too deeply)"),
])
def test_the_api_answer_is_read_strictly(body: bytes, found: object) -> None:
    parsed = parse_release(body)
    assert parsed == found if not isinstance(found, str) else str(parsed).startswith(found)


# --- a total deadline ---------------------------------------------------------------------------------


@pytest.fixture
def trickler() -> Iterator[tuple[int, list[int]]]:
    """A loopback HTTP server that sends its status line and headers, then one byte of a 400-byte body every
    50 ms (each well inside any read timeout): at most 400 bytes and 20 s, and it stops when the client goes.
    Yields (port, [bytes sent])."""
    sent = [0]
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def serve() -> None:
        started = time.monotonic()
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n")
                    while sent[0] < 400 and not stop.is_set() and time.monotonic() - started < 20:
                        conn.sendall(b"x")
                        sent[0] += 1
                        time.sleep(0.05)
                except OSError:  # the client hung up
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], sent
    finally:
        stop.set()
        thread.join(25)
        listener.close()


def test_a_trickling_server_is_cut_off_at_the_deadline(tmp_path: Path,
                                                       trickler: tuple[int, list[int]]) -> None:
    port, sent = trickler
    url = f"http://127.0.0.1:{port}{ASSET}"
    fetcher = Fetcher(timeout=3, deadline=1.0, authenticator=lock_for(tmp_path, {url: b"x" * 400}))
    started = time.monotonic()
    with pytest.raises(FetchError) as late:
        fetcher.fetch(url, tmp_path / "a.whl", max_bytes=10**6)
    elapsed = time.monotonic() - started
    assert "took over the download deadline of 1 s" in late.value.reason, late.value.reason
    assert elapsed < 3, elapsed  # not the 20 s the whole body takes at this pace
    assert 0 < sent[0] < 400
    assert not (tmp_path / "a.whl").exists()
    # That host is not asked again in this run: the next key is told at once.
    started = time.monotonic()
    with pytest.raises(FetchError, match="earlier in this run"):
        fetcher.fetch(url, tmp_path / "b.whl", max_bytes=10**6)
    assert time.monotonic() - started < 0.5


def test_trickled_headers_are_cut_off_too(tmp_path: Path) -> None:
    # The status line and headers one byte per 50 ms: no read ever times out, and no body is reached.
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(5)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                for _ in range(400):  # bounded: 20 s at most, less when the client hangs up
                    if stop.is_set():
                        return
                    try:
                        conn.sendall(b"X-Slow: y\r\n"[:1] if _ else b"HTTP/1.1 200 OK\r\n")
                    except OSError:
                        return
                    time.sleep(0.05)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}{ASSET}"
        started = time.monotonic()
        try:
            with pytest.raises(FetchError, match=r"deadline of 0\.8 s"):
                Fetcher(timeout=3, deadline=0.8, authenticator=lock_for(tmp_path, {url: BODY})).fetch(
                    url, tmp_path / "a.whl", max_bytes=10**6)
            assert time.monotonic() - started < 3
        finally:
            stop.set()
            thread.join(25)


# --- what it unpacks to ---------------------------------------------------------------------------------


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_wheel_that_unpacks_to_too_much_is_refused_from_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Real deflated members; the limits scaled down (the shipped ones are GiB) so the test stays small.
    monkeypatch.setattr(wheelarchive, "MAX_MEMBER_BYTES", 2 * 1024**2)
    monkeypatch.setattr(wheelarchive, "MAX_TOTAL_BYTES", 5 * 1024**2)
    cases = {
        "ok": (zipped({"m/a.so": bytes(2 * 1024**2), "m-1.dist-info/METADATA": b"Name: m\n"}), None),
        "member": (zipped({"m/a.so": bytes(2 * 1024**2 + 1)}), "'m/a.so' unpacks to 2097153 bytes"),
        "total": (zipped({f"m/{n}.so": bytes(2 * 1024**2) for n in range(3)}), "unpacks to 6291456 bytes"),
        # read whole into memory: the shipped limit, 16 MiB, in 17 MiB of zeros (17 kB deflated)
        "metadata": (zipped({"m-1.dist-info/METADATA": bytes(17 * 1024**2)}), "'m-1.dist-info/METADATA'"),
        "not a zip": (b"<html>rate limited</html>", "not a readable wheel"),
    }
    for name, (data, problem) in cases.items():
        path = tmp_path / f"{name}.whl"
        path.write_bytes(data)
        found = wheelarchive.archive_problem(path)
        assert found == problem if problem is None else problem in str(found), (name, found)
    assert len(cases["metadata"][0]) < 100_000


def test_the_fetcher_removes_a_wheel_that_unpacks_to_too_much(tmp_path: Path, trusted_ca: TestCA) -> None:
    bomb = zipped({"causal_conv1d-1.6.1.dist-info/METADATA": bytes(17 * 1024**2)})
    files = {ASSET: bomb}
    with ReleaseServer({**files, **github_api(files)}, tls=trusted_ca) as server:
        fetcher = Fetcher(timeout=5, authenticator=ReleaseDigests(), inspect=wheelarchive.archive_problem)
        too_much = r"METADATA' unpacks to 17825792 bytes, over the limit of 16777216"
        with pytest.raises(FetchError, match=too_much):
            fetcher.fetch(server.url + ASSET, tmp_path / "a.whl", max_bytes=10**6)
    assert not (tmp_path / "a.whl").exists()
