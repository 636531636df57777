"""File transfer over the real path: paramiko SFTP to a lab node (OpenSSH's internal-sftp), then the `pct`
stand-in's push/pull into an overlay container, through `Fleet.guest(target)` as the playbook runner uses it.

What each test checks besides the bytes: the sha256 both ends agree on, the mode, that nothing is left in the
node's staging directory or beside the destination, and that a failure leaves the destination untouched.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetfix.errors import GuestError, TransferError
from fleetfix.fleet import Fleet
from fleetfix.guests import Guest
from fleetfix.guests.transfer import NODE_STAGING_DIR, guest_digest
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from tests.lab.bed import Lab
from tests.lab.container import Container

MakeCt = Callable[..., Container]


def staging_leftovers(lab: Lab) -> list[str]:
    # What the node sees as its /var/tmp is its own directory (tests/lab/sshd.py), so a transfer of a test
    # running beside this one (another xdist worker) never shows up here.
    assert NODE_STAGING_DIR == "/var/tmp"
    return sorted(name for name in os.listdir(lab.node().ssh.var_tmp) if name.startswith("fleetfix-"))


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet() as opened:
        yield opened


def target(lab: Lab, ctid: int | None = None) -> Target:
    node = lab.node()
    settings = SSHSettings(node.address, node.port, identity_file=str(lab.client_key),
                           known_hosts=str(lab.known_hosts), connect_timeout=10)
    guest = GuestRef.lxc(ctid) if ctid is not None else GuestRef()
    return Target(f"{node.name}/{ctid}" if ctid else node.name, NodeRef(node.name, settings), guest)


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    path = tmp_path / "payload.bin"
    path.write_bytes(os.urandom(3 * 1024 * 1024 + 17))  # several SFTP requests, not a multiple of any
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_push_then_pull_a_container_file(lab: Lab, make_ct: MakeCt, fleet: Fleet, payload: Path,
                                         tmp_path: Path) -> None:
    ct = make_ct()
    before = staging_leftovers(lab)
    guest: Guest = fleet.guest(target(lab, ct.ctid))
    pushed = guest.push(payload, "/root/payload.bin", mode=0o640)
    assert (pushed.size, pushed.sha256) == (payload.stat().st_size, sha256(payload))
    assert ct.sh("stat -c %a /root/payload.bin").stdout.decode().strip() == "640"
    assert ct.sh("sha256sum < /root/payload.bin").stdout.decode().split()[0] == pushed.sha256
    assert ct.sh("ls -a /root | grep -c fleetfix || true").stdout.decode().strip() == "0"
    calls = [argv for argv in lab.node().pct_calls() if argv[:1] == ["push"]]
    assert calls and calls[-1][-2:] == ["--perms", "0600"]  # staged privately, chmod'ed only once verified

    back = tmp_path / "back.bin"
    pulled = guest.pull("/root/payload.bin", back)
    assert back.read_bytes() == payload.read_bytes() and pulled.sha256 == pushed.sha256
    assert oct(back.stat().st_mode & 0o777) == "0o600"  # controller-side files are private
    assert [p.name for p in tmp_path.iterdir() if "fleetfix" in p.name] == []
    assert staging_leftovers(lab) == before

    # The digest the playbook steps compare for idempotency: read-only, and None for no file.
    found = guest_digest(guest.transport(), "/root/payload.bin")
    assert found is not None and (found.sha256, found.size, found.mode) == (pushed.sha256, pushed.size, 0o640)
    assert guest_digest(guest.transport(), "/root/none") is None


def test_the_node_itself_over_sftp(lab: Lab, fleet: Fleet, payload: Path, tmp_path: Path) -> None:
    guest = fleet.guest(target(lab))
    dest = tmp_path / "on-node.bin"  # the node sees this machine's filesystem
    pushed = guest.push(payload, str(dest), mode=0o600)
    assert dest.read_bytes() == payload.read_bytes() and pushed.sha256 == sha256(payload)
    back = tmp_path / "back.bin"
    assert guest.pull(str(dest), back).sha256 == pushed.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "on-node.bin", "payload.bin"]


def test_failures_leave_nothing_behind(lab: Lab, make_ct: MakeCt, fleet: Fleet, payload: Path,
                                       tmp_path: Path) -> None:
    ct = make_ct()
    ct.write_file("/root/keep.txt", "unchanged\n")
    stopped = make_ct(running=False)
    before = staging_leftovers(lab)
    guest = fleet.guest(target(lab, ct.ctid))

    # pct push fails inside its worker and exits 0 (as real pct does): only the checksum notices.
    with pytest.raises(TransferError, match="nothing arrived") as missing_dir:
        guest.push(payload, "/no/such/dir/payload.bin")
    assert "pct push: failed to create file" in str(missing_dir.value)

    # Pulling a missing file: refused before pct pull runs; the local destination is never created.
    with pytest.raises(TransferError, match="no such file"):
        guest.pull("/root/none", tmp_path / "none")

    # Over the size limit: refused before a byte moves, both ways.
    with pytest.raises(TransferError, match="over the limit"):
        guest.push(payload, "/root/keep.txt", max_bytes=1024)
    with pytest.raises(TransferError, match="over the limit"):
        guest.pull("/root/keep.txt", tmp_path / "keep", max_bytes=4)
    assert ct.sh("cat /root/keep.txt").stdout == b"unchanged\n"

    # A stopped CT is a guest error (the target is unreachable), as for pct exec.
    with pytest.raises(GuestError, match="stopped"):
        fleet.guest(target(lab, stopped.ctid)).push(payload, "/root/payload.bin")

    assert [p.name for p in tmp_path.iterdir()] == ["payload.bin"]
    assert staging_leftovers(lab) == before
    assert ct.sh("ls -a /root /no 2>/dev/null | grep -c fleetfix || true").stdout.decode().strip() == "0"
