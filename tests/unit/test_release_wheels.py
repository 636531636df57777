"""Upstream's release wheels: the name a key asks for and the matching of names (wheels.release), the
controller's bounded download (wheels.httpfetch) against a loopback stand-in, and the dist-info check
(wheels.cache.wheel_problem)."""

from __future__ import annotations

import hashlib
import io
import socket
import struct
import threading
import time
import zipfile
from pathlib import Path

import pytest

from fleetfix.wheels.cache import wheel_problem
from fleetfix.wheels.httpfetch import Fetcher, FetchError
from fleetfix.wheels.release import Candidate, candidate, label_for, mismatch
from tests.lab.releases import ReleaseServer, make_wheel, refused_port
from tests.lab.tlsca import TestCA

CAUSAL = ("https://github.com/Dao-AILab/causal-conv1d/releases/download/v{version}/causal_conv1d-{version}"
          "+cu{cuda_major}torch{torch}cxx11abi{cxx11abi}-{python_tag}-{python_tag}-{platform}.whl")
KEY = {"name": "causal-conv1d", "version": "1.6.1", "python_tag": "cp312", "torch": "2.8.0+cu128",
       "torch_cuda": "12.8", "cxx11_abi": "1", "machine": "x86_64", "cuda_toolkit": "12.8",
       "arch_list": "9.0", "build_env": "CAUSAL_CONV1D_FORCE_BUILD=TRUE", "libc": "glibc 2.36"}
# DOMAIN.md 3.1's example, as upstream's setup.py computes it for torch 2.8 + cu128 + py3.12.
PUBLISHED = "causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def test_the_key_asks_for_the_name_setup_py_computes() -> None:
    found = candidate(CAUSAL, KEY)
    assert found == Candidate(
        url=f"https://github.com/Dao-AILab/causal-conv1d/releases/download/v1.6.1/{PUBLISHED}",
        filename=PUBLISHED, install_name="causal_conv1d-1.6.1-cp312-cp312-linux_x86_64.whl",
        tag="cp312-cp312-linux_x86_64")
    assert mismatch(PUBLISHED, KEY) is None


@pytest.mark.parametrize(("field", "value", "label"), [
    ("torch_cuda", "13.0", "+cu13torch2.8"),
    ("torch_cuda", "11.8", "+cu11torch2.8"),
    ("torch", "2.10.0", "torch2.10cxx"),        # major.minor, not a float: 2.10 is not 2.1
    ("torch", "2.9.1", "torch2.9cxx"),
    ("cxx11_abi", "0", "cxx11abiFALSE"),
    ("python_tag", "cp311", "-cp311-cp311-"),
    ("machine", "aarch64", "-linux_aarch64.whl"),  # what the arm release runner's bdist_wheel names
])
def test_each_label_field_comes_from_the_key(field: str, value: str, label: str) -> None:
    found = candidate(CAUSAL, {**KEY, field: value})
    assert isinstance(found, Candidate) and label in found.filename


@pytest.mark.parametrize(("name", "differs"), [
    ("causal_conv1d-1.6.1+cu13torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "cuda_major 13"),
    ("causal_conv1d-1.6.1+cu12torch2.7cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "torch 2.7"),
    ("causal_conv1d-1.6.1+cu12torch2.8cxx11abiFALSE-cp312-cp312-linux_x86_64.whl", "cxx11abi FALSE"),
    ("causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl", "python_tag cp311"),
    ("causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-abi3-linux_x86_64.whl", "abi tag abi3"),
    ("causal_conv1d-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_aarch64.whl", "platform linux_aarch64"),
    ("causal_conv1d-1.6.0+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "version 1.6.0"),
    ("mamba_ssm-1.6.1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "is mamba-ssm"),
    ("causal_conv1d-1.6.1+cu122torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "cuda_major 122"),
    ("causal_conv1d-1.6.1-cp312-cp312-linux_x86_64.whl", "is not named"),  # no label: not upstream's
    ("causal_conv1d-1.6.1+cu12torch2.8-cp312-cp312-linux_x86_64.whl", "is not named"),
])
def test_a_name_that_differs_in_any_field_is_refused(name: str, differs: str) -> None:
    problem = mismatch(name, KEY)
    assert problem is not None and differs in problem


@pytest.mark.parametrize(("change", "why"), [
    ({"torch": "2.6.0a0+ecf3bae40a"}, "not a final release"),   # NGC's torch: another label upstream
    ({"torch": "2.9.0.dev20250801+cu128"}, "not a final release"),
    ({"torch_cuda": "14.0"}, "has no release label"),           # flash-attn would ask for cu13: not us
    ({"torch_cuda": ""}, "the key has no torch_cuda"),
    ({"cxx11_abi": ""}, "the key has no cxx11_abi"),
    ({"machine": "ppc64le"}, "no release wheels"),
    ({"version": "1.6.1+local"}, "not a public release version"),
    ({"python_tag": "pp310"}, "not CPython 3"),
])
def test_keys_the_scheme_cannot_express_have_no_candidate(change: dict[str, str], why: str) -> None:
    key = {**KEY, **change}
    assert why in str(label_for(key)) and isinstance(candidate(CAUSAL, key), str)


@pytest.mark.parametrize(("template", "why"), [
    # A template that hard-codes a label field never yields another key's wheel.
    (CAUSAL.replace("cu{cuda_major}", "cu13"), "cuda_major 13 (the key's: 12)"),
    (CAUSAL.replace("{python_tag}-{python_tag}", "cp312-cp312").replace("{version}+", "1.6.0+"),
     "version 1.6.0"),
    (CAUSAL.replace("causal_conv1d-", "flash_attn-"), "is flash-attn"),
    (CAUSAL + "{arch}", "unknown placeholders: arch"),
    (CAUSAL.replace("{version}", "{version", 1), "malformed"),
    ("file:///srv/" + CAUSAL.rpartition("/")[2], "not an http(s) URL"),
    (CAUSAL + "?x=1", "not an http(s) URL of a file"),
])
def test_a_template_that_does_not_give_the_keys_name_is_refused(template: str, why: str) -> None:
    found = candidate(template, KEY)
    assert isinstance(found, str) and why in found, found


# --- the download -------------------------------------------------------------------------------------


# The download's mechanics (streaming, bounds, the run's memory of hosts), over https from a stand-in whose
# test CA this process trusts (`trusted_ca`), and with no digest to check: the operator's opt-in,
# allow_unverified. Digests: tests/unit/security/test_release_wheel_trust.py.


def unverified(timeout: float) -> Fetcher:
    return Fetcher(timeout=timeout, allow_unverified=True)


@pytest.mark.usefixtures("trusted_ca")
def test_fetch_streams_hashes_and_bounds(tmp_path: Path, test_ca: TestCA) -> None:
    body = b"wheel bytes " * 1000
    with ReleaseServer({"/a.whl": body}, tls=test_ca) as server:
        fetcher = unverified(5)
        got = fetcher.fetch(f"{server.url}/a.whl", tmp_path / "a.whl", max_bytes=len(body))
        assert (tmp_path / "a.whl").read_bytes() == body and got.size == len(body)
        assert oct((tmp_path / "a.whl").stat().st_mode & 0o777) == "0o600"
        assert got.sha256 == hashlib.sha256(body).hexdigest()

        with pytest.raises(FetchError) as missing:
            fetcher.fetch(f"{server.url}/b.whl", tmp_path / "b.whl", max_bytes=10**6)
        assert "HTTP 404" in missing.value.reason and not missing.value.unreachable
        assert not (tmp_path / "b.whl").exists()

        with pytest.raises(FetchError) as big:
            fetcher.fetch(f"{server.url}/a.whl", tmp_path / "c.whl", max_bytes=len(body) - 1)
        assert "over the limit" in big.value.reason and not (tmp_path / "c.whl").exists()
        # a 404 does not make the host unreachable: the next wheel is asked for again
        fetcher.fetch(f"{server.url}/a.whl", tmp_path / "d.whl", max_bytes=len(body))
        assert server.requests["/b.whl"] == 1 and server.requests["/a.whl"] == 3


def test_an_unreachable_host_is_asked_once_per_run(tmp_path: Path) -> None:
    fetcher = unverified(5)
    with refused_port() as port:
        url = f"https://127.0.0.1:{port}/v1/a.whl"
        with pytest.raises(FetchError) as first:
            fetcher.fetch(url, tmp_path / "a.whl", max_bytes=100)
        assert first.value.unreachable and "refused" in first.value.reason.lower()
        with pytest.raises(FetchError) as again:  # another file on that host: answered from memory
            fetcher.fetch(f"https://127.0.0.1:{port}/v2/b.whl", tmp_path / "b.whl", max_bytes=100)
        assert again.value.unreachable and "earlier in this run" in again.value.reason
    assert not list(tmp_path.iterdir())


def test_targets_asking_at_the_same_moment_try_an_unanswering_host_once(tmp_path: Path) -> None:
    # Targets of different keys reach the download together. A host that takes each connection and
    # hangs up without an answer (counted here: a refused connection leaves nothing to count) must be
    # tried by one of them; the others wait for that outcome. Without the gate all four connect.
    accepted: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        stop = threading.Event()

        def hang_up() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                accepted.append(1)
                time.sleep(0.3)  # long enough for every other thread to be at the door
                conn.close()

        server = threading.Thread(target=hang_up, daemon=True)
        server.start()
        fetcher, start = unverified(5), threading.Barrier(4)
        reasons: list[str] = []

        def fetch(index: int) -> None:
            start.wait()
            try:
                fetcher.fetch(f"https://127.0.0.1:{port}/{index}.whl", tmp_path / f"{index}.whl",
                              max_bytes=10)
            except FetchError as error:
                assert error.unreachable
                reasons.append(error.reason)

        threads = [threading.Thread(target=fetch, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        stop.set()
        server.join(5)
    assert len(accepted) == 1 and len(reasons) == 4, (accepted, reasons)
    assert sum("earlier in this run" in reason for reason in reasons) == 3, reasons
    assert not list(tmp_path.iterdir())


@pytest.mark.usefixtures("trusted_ca")
def test_a_host_that_answers_is_not_waited_on(tmp_path: Path, test_ca: TestCA) -> None:
    # The gate is for the first try only: a 404 is an answer, and every target then asks for itself.
    with ReleaseServer(tls=test_ca) as server:
        fetcher, start = unverified(5), threading.Barrier(3)
        reasons: list[str] = []

        def fetch(index: int) -> None:
            start.wait()
            with pytest.raises(FetchError) as error:
                fetcher.fetch(f"{server.url}/{index}.whl", tmp_path / f"{index}.whl", max_bytes=10)
            reasons.append(error.value.reason)

        threads = [threading.Thread(target=fetch, args=(index,)) for index in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(server.requests) == ["/0.whl", "/1.whl", "/2.whl"]
    assert len(reasons) == 3 and all("HTTP 404" in reason for reason in reasons), reasons


def test_a_host_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    # A listening socket nobody accepts from: the kernel completes the connection, no reply ever comes.
    # The outcome does not depend on speed: without the read timeout this test would hang (pytest-timeout).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with pytest.raises(FetchError) as error:
            unverified(0.2).fetch(f"https://127.0.0.1:{port}/a.whl", tmp_path / "a.whl", max_bytes=1)
    assert error.value.unreachable and "timed out" in error.value.reason
    assert not list(tmp_path.iterdir())


def test_name_resolution_is_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # getaddrinfo takes no timeout: a resolver that never answers (an air-gapped site's) must not hold
    # the apply. Stand-ins for the resolver, so no query leaves this machine.
    release = threading.Event()

    def silent(*args: object, **kwargs: object) -> list[object]:
        release.wait()
        raise socket.gaierror("released by the test")

    monkeypatch.setattr(socket, "getaddrinfo", silent)
    fetcher = unverified(0.01)
    try:
        with pytest.raises(FetchError) as silence:
            fetcher.fetch("https://github.com/a.whl", tmp_path / "a.whl", max_bytes=1)
        assert silence.value.unreachable and "resolving github.com took over" in silence.value.reason
    finally:
        release.set()

    def no_such_name(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(FetchError) as unknown:
        unverified(5).fetch("https://github.com/a.whl", tmp_path / "a.whl", max_bytes=1)
    assert unknown.value.unreachable and "cannot resolve github.com" in unknown.value.reason
    assert not list(tmp_path.iterdir())


def test_a_refused_url_is_not_fetched_again(tmp_path: Path, test_ca: TestCA) -> None:
    with ReleaseServer({"/a.whl": b"x"}, tls=test_ca) as server:
        fetcher = unverified(5)
        fetcher.refuse(f"{server.url}/a.whl", "a.whl: its import check failed")
        with pytest.raises(FetchError, match="import check failed"):
            fetcher.fetch(f"{server.url}/a.whl", tmp_path / "a.whl", max_bytes=10)
        assert server.requests["/a.whl"] == 0


# --- what is inside ------------------------------------------------------------------------------------

TAG = "cp312-cp312-linux_x86_64"


def _damaged(wheel: bytes) -> bytes:
    """wheel with one byte of its first member's stored data flipped (what a bad mirror or disk does)."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        first = archive.infolist()[0]
    # The local header: 30 fixed bytes, whose last four are the name's and the extra field's lengths.
    name_length, extra_length = struct.unpack_from("<HH", wheel, first.header_offset + 26)
    offset = first.header_offset + 30 + name_length + extra_length + first.compress_size // 2
    return wheel[:offset] + bytes([wheel[offset] ^ 0xFF]) + wheel[offset + 1:]


@pytest.mark.parametrize(("wheel", "problem"), [
    (make_wheel("causal_conv1d", "1.6.1", TAG, {"causal_conv1d/__init__.py": ""}), None),
    (make_wheel("causal_conv1d", "1.6.0", TAG, {}), "says causal-conv1d 1.6.0"),
    (make_wheel("mamba_ssm", "1.6.1", TAG, {}), "says mamba-ssm 1.6.1"),
    (make_wheel("causal_conv1d", "1.6.1", "cp311-cp311-linux_x86_64", {}), "tags are cp311"),
    # the label inside the metadata: pip would refuse it under the plain name
    (make_wheel("causal_conv1d", "1.6.1", TAG, {}, metadata_version="1.6.1+cu12torch2.8cxx11abiTRUE"),
     "1.6.1+cu12"),
    (b"<html>rate limited</html>", "not a readable wheel"),
    # damaged on the way: the zip's directory is intact, a member's bytes are not
    (_damaged(make_wheel("causal_conv1d", "1.6.1", TAG, {"causal_conv1d_cuda.so": bytes(range(256)) * 64})),
     "not a readable wheel"),
])
def test_the_wheels_own_metadata_must_be_the_key(tmp_path: Path, wheel: bytes, problem: str | None) -> None:
    path = tmp_path / "w.whl"
    path.write_bytes(wheel)
    found = wheel_problem(path, name="causal-conv1d", version="1.6.1", tag=TAG)
    assert found == problem if problem is None else problem in str(found)
