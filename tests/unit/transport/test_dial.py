"""Dialling before paramiko is imported (transport/dial.py): the identification line is sent once, and
dial_ahead's sockets are taken once, or their error raised. Loopback listeners only."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from fleetfix.errors import ConnectRefusedError, TransportError
from fleetfix.target import SSHSettings
from fleetfix.transport import dial


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def _settings(server: socket.socket) -> SSHSettings:
    return SSHSettings(address="127.0.0.1", port=server.getsockname()[1], connect_timeout=5)


def test_the_identification_line_goes_out_at_dial_time_and_paramikos_copy_is_dropped(
        listener: socket.socket) -> None:
    sock = dial.dial(_settings(listener))
    peer, _ = listener.accept()
    with sock, peer:
        peer.settimeout(5)
        assert peer.recv(100) == f"{dial.CLIENT_VERSION}\r\n".encode()
        line = f"{dial.CLIENT_VERSION}\r\n".encode()
        assert sock.send(line) == len(line)  # what paramiko writes first: already sent, dropped
        sock.sendall(b"KEXINIT")  # everything after goes out as usual
        assert peer.recv(100) == b"KEXINIT"


def test_the_dialled_socket_sends_small_packets_at_once(listener: socket.socket) -> None:
    """TCP_NODELAY, as OpenSSH sets it: SSH's small packets (a channel open, an exec request) are each
    waited for by the other side, and Nagle's algorithm held one back until the previous one's ACK, which
    the peer delays (up to 40 ms on Linux): the first channel of every probe took 65 ms at a 20 ms RTT."""
    with dial.dial(_settings(listener)) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_different_first_line_is_refused_rather_than_sent(listener: socket.socket) -> None:
    with dial.dial(_settings(listener)) as sock, pytest.raises(TransportError, match="mismatch"):
        sock.send(b"SSH-2.0-paramiko_5.1.0\r\n")


def test_dial_ahead_parks_a_socket_for_take_once(listener: socket.socket) -> None:
    settings = _settings(listener)
    dial.dial_ahead([settings, settings], limit=4)
    taken = dial.take(settings)
    assert taken is not None
    taken.close()
    assert dial.take(settings) is None  # once: the next connection to the node dials again


def test_dial_ahead_keeps_the_error_for_take() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        settings = _settings(server)
    dial.dial_ahead([settings], limit=1)  # the port is closed now: refused
    with pytest.raises(ConnectRefusedError):
        dial.take(settings)


def test_dial_ahead_dials_at_most_limit_nodes(listener: socket.socket) -> None:
    first = _settings(listener)
    second = SSHSettings(address="127.0.0.1", port=first.port, user="other")  # another node key
    dial.dial_ahead([first, second], limit=1)
    taken = dial.take(first)
    assert taken is not None and dial.take(second) is None
    taken.close()
