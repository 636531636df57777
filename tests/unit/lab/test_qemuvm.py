"""The real-VM part of the test bed: qemu-server's agent conversation (qga_real.py) and the image's pieces
(qemuvm.py). The end-to-end proof against QEMU and Debian's qemu-ga is tests/e2e/test_real_vm.py."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import qga_real
from tests.lab.qemuvm import _cpio_newc, _modules_in_load_order


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """A socket that records what it is sent and answers with the bytes a test queues."""
    path = str(tmp_path / "qga.sock")
    received: list[bytes] = []
    answers: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                data = b""
                while data.count(b"\n") < 2:
                    data += connection.recv(4096)
                received.append(data)
                if answers:
                    connection.sendall(answers.pop(0))
                connection.recv(1)  # like QEMU's chardev: open until the client hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, received, answers
    server.close()


def test_sync_delimited_first_then_the_command_and_older_answers_are_skipped(
    agent: tuple[str, list[bytes], list[bytes]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, received, answers = agent
    monkeypatch.setattr(qga_real, "_sequence", 6)
    expected_id = int(f"{os.getpid()}07")
    # An abandoned command's answer still in the channel, then ours: QMPClient skips the older id.
    answers.append(b'junk\xff{"return": 1}\n{"return": {"pid": 1}}\n'
                   + b'\xff{"return": %d}\n{"return": {"pid": 42}}\n' % expected_id)
    answer = qga_real.command(path, "guest-exec", {"path": "true"}, timeout=5)
    assert answer == {"return": {"pid": 42}}
    sync, request, _ = received[0].split(b"\n")
    assert json.loads(sync) == {"execute": "guest-sync-delimited", "arguments": {"id": expected_id}}
    assert json.loads(request) == {"execute": "guest-exec", "arguments": {"path": "true"}}


def test_a_newer_id_is_pves_wrong_command_id_and_silence_is_got_timeout(
    agent: tuple[str, list[bytes], list[bytes]],
) -> None:
    path, _, answers = agent
    answers.append(b'\xff{"return": 999999999999}\n{"return": {}}\n')
    with pytest.raises(qga_real.AgentError, match="got wrong command id"):
        qga_real.command(path, "guest-ping", timeout=5)
    with pytest.raises(qga_real.AgentError, match=r"^got timeout$"):
        qga_real.command(path, "guest-ping", timeout=0.5)  # nothing queued: no answer
    assert not qga_real.ping(path + ".missing", timeout=0.5)


def test_initramfs_archive_is_cpio_newc_with_a_trailer(tmp_path: Path) -> None:
    archive = _cpio_newc([("init", 0o100755, b"\x7fELF..."), ("lib", 0o040755, b"")])
    offset, seen = 0, []
    while True:
        header = archive[offset:offset + 110].decode()
        assert header.startswith("070701")
        fields = [int(header[6 + 8 * index:14 + 8 * index], 16) for index in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name = archive[offset + 110:offset + 110 + name_size - 1].decode()
        data_start = (offset + 110 + name_size + 3) // 4 * 4
        seen.append((name, mode, archive[data_start:data_start + size]))
        offset = (data_start + size + 3) // 4 * 4
        if name == "TRAILER!!!":
            break
    assert seen == [("init", 0o100755, b"\x7fELF..."), ("lib", 0o040755, b""), ("TRAILER!!!", 0, b"")]
    assert offset == len(archive)


def test_modules_load_after_their_dependencies_and_built_ins_are_skipped(tmp_path: Path) -> None:
    for name, depends in (("virtio_pci", "virtio_pci_modern_dev,virtio_pci_legacy_dev"),
                          ("virtio_pci_modern_dev", ""), ("virtio_pci_legacy_dev", ""),
                          ("virtio_blk", "virtio_ring")):
        (tmp_path / f"{name}.ko").write_bytes(b"\x00license=GPL\x00depends=" + depends.encode() + b"\x00")
    order = [path.stem for path in _modules_in_load_order(tmp_path, ("virtio_pci", "virtio_blk"))]
    assert order == ["virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_blk"]
