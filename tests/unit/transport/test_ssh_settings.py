"""SSH pieces that need no server: jump-host specs, private keys, and a refused connection."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fleetfix.errors import AuthenticationError, ConfigError, ConnectError
from fleetfix.target import SSHSettings
from fleetfix.transport import ssh
from fleetfix.transport.ssh import (
    PASSPHRASE_ENV,
    SSHConnection,
    key_file_is_encrypted,
    load_private_key,
    parse_jump_host,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("bastion", ("root", "bastion", 22)),
        ("admin@bastion:2201", ("admin", "bastion", 2201)),
        ("127.0.0.3:2222", ("root", "127.0.0.3", 2222)),
        ("ops@[::1]:22", ("ops", "::1", 22)),
    ],
)
def test_jump_host_spec(spec: str, expected: tuple[str, str, int]) -> None:
    assert parse_jump_host(spec, default_user="root") == expected


@pytest.mark.parametrize("spec", ["", "a b", "host:port", "@host", "user@"])
def test_bad_jump_host_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="jump_host"):
        parse_jump_host(spec, default_user="root")


def keygen(path: Path, passphrase: str, kind: str = "ed25519") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-f", str(path)], check=True)
    return path


@pytest.mark.parametrize("key_format", ["RFC4716", "PEM", "PKCS8"])  # RFC4716: OpenSSH's own format
@pytest.mark.parametrize("passphrase", ["", "s3cret-pass"])
def test_an_encrypted_key_file_is_told_from_the_file_itself(
    tmp_path: Path, key_format: str, passphrase: str
) -> None:
    path = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-m", key_format, "-N", passphrase, "-f", str(path)],
                   check=True)
    assert key_file_is_encrypted(str(path)) is bool(passphrase)


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_plain_keys_load(tmp_path: Path, kind: str) -> None:
    key = load_private_key(str(keygen(tmp_path / kind, "", kind)))
    assert key.can_sign()


def test_encrypted_key_needs_the_passphrase_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(keygen(tmp_path / "enc", "s3cret-pass"))
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    with pytest.raises(AuthenticationError) as caught:
        load_private_key(path)
    assert str(caught.value) == (
        f"identity file {path} is encrypted: set {PASSPHRASE_ENV} or load the key into ssh-agent"
    )
    monkeypatch.setenv(PASSPHRASE_ENV, "wrong")
    with pytest.raises(AuthenticationError, match="wrong passphrase") as wrong:
        load_private_key(path)
    assert "wrong" not in str(wrong.value).replace("wrong passphrase", "")  # the passphrase is never shown
    monkeypatch.setenv(PASSPHRASE_ENV, "s3cret-pass")
    assert load_private_key(path).can_sign()


@pytest.fixture
def counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every real load of a key file (parse and KDF) from here on, by path."""
    loads: list[str] = []
    real = ssh._load_private_key

    def counting(path: str, full_path: str, passphrase: str | None) -> object:
        loads.append(path)
        return real(path, full_path, passphrase)

    monkeypatch.setattr(ssh, "_load_private_key", counting)
    return loads


def test_a_key_file_is_loaded_once_per_process_until_it_changes(tmp_path: Path, counted_loads: list[str]
                                                                ) -> None:
    path = str(keygen(tmp_path / "id", ""))
    found: list[object] = []
    threads = [threading.Thread(target=lambda: found.append(load_private_key(path))) for _ in range(8)]
    for thread in threads:  # the first connects of a fleet ask for it all at once
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 8 and all(key is found[0] for key in found)
    assert counted_loads == [path]
    Path(path).unlink()
    keygen(tmp_path / "id", "")  # replaced by another key: loaded again
    assert load_private_key(path).fingerprint != found[0].fingerprint  # type: ignore[attr-defined]
    assert counted_loads == [path, path]


def test_a_key_that_fails_to_load_fails_once_with_the_same_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted_loads: list[str]
) -> None:
    path = str(keygen(tmp_path / "enc", "s3cret-pass"))
    monkeypatch.setenv(PASSPHRASE_ENV, "wrong")
    messages = set()
    for _ in range(3):  # one node's connection each: the KDF ran for the first only
        with pytest.raises(AuthenticationError) as caught:
            load_private_key(path)
        messages.add(str(caught.value))
    assert messages == {f"cannot load identity file {path}: wrong passphrase or unreadable key"}
    assert counted_loads == [path]
    monkeypatch.setenv(PASSPHRASE_ENV, "s3cret-pass")  # another passphrase: tried again
    assert load_private_key(path).can_sign()
    assert counted_loads == [path, path]


def test_missing_and_garbage_identity_files(tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError, match="does not exist"):
        load_private_key(str(tmp_path / "nope"))
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key\n")
    garbage.chmod(0o600)  # else refused for its permissions first, as OpenSSH does
    with pytest.raises(AuthenticationError, match="cannot load identity file"):
        load_private_key(str(garbage))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_refused_port_is_a_quick_one_line_connect_error() -> None:
    port = free_port()  # nothing listens there now
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        SSHConnection(SSHSettings("127.0.0.1", port, connect_timeout=10)).open()
    assert time.monotonic() - started < 5  # well before the 10 s timeout: refused is not waited for
    assert str(caught.value) == f"127.0.0.1:{port}: connection refused"


def test_a_server_that_is_not_ssh_is_a_connect_error() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_garbage() -> None:
            conn, _ = server.accept()
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            conn.close()

        thread = threading.Thread(target=answer_garbage)
        thread.start()
        with pytest.raises(ConnectError, match=f"127.0.0.1:{port}: SSH handshake failed"):
            SSHConnection(SSHSettings("127.0.0.1", port, connect_timeout=5)).open()
        thread.join()


def test_a_server_that_never_answers_times_out_at_connect_timeout() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # the kernel accepts the connection; nobody ever sends a banner
        port = server.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectError, match=f"^127.0.0.1:{port}: SSH handshake") as caught:
            SSHConnection(SSHSettings("127.0.0.1", port, connect_timeout=0.5)).open()
        assert time.monotonic() - started < 4  # honoured, not the library's default of minutes
        assert "\n" not in str(caught.value)
