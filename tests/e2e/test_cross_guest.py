"""A guest cannot change what its neighbours run (docs/security.md, "cross-guest paths").

The attacker is root in one container; in the test bed a container has no user namespace, so that root is
as privileged as a privileged LXC's (GPU containers often are). It runs as a daemon that watches every
process it can see and, wherever a command's stdin is something it can reopen for writing through
/proc/PID/fd/0 (a regular file, a pipe), writes a payload into it: prepended to what is there for a file,
appended for a pipe. The payload leaves a marker in whichever container runs it. Then fleetfix runs its
commands over the whole node, through the real CLI and sshd, and no other container may have the marker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container

MARKER = "root/fleetfix-payload-ran"  # relative to a container's root (and so to its upper dir)
ATTACKER_LOG = "root/attacker.log"

# The daemon. Each stdin it reaches is logged as one JSON line (what kind, which command read it), so the
# test can tell an attacker that found nothing from one whose writes had no effect on the others.
ATTACKER = r"""
import json, os, stat, sys, time
payload = b"echo ran >/MARKER\n".replace(b"MARKER", sys.argv[1].encode())
log = open(sys.argv[2], "a")
done = set()
until = time.monotonic() + 300
while time.monotonic() < until:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = "/proc/%s/fd/0" % pid
        try:
            info = os.stat(path)
            key = (info.st_dev, info.st_ino)
            if key in done:
                continue
            if stat.S_ISREG(info.st_mode):
                with open(path, "r+b") as reopened:  # a new open of the same file: an offset of its own
                    script = reopened.read()
                    reopened.seek(0)
                    reopened.write(payload + script)
                kind = "file"
            elif stat.S_ISFIFO(info.st_mode):
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # the reader's own pipe, opened for writing
                try:
                    os.write(fd, payload)
                finally:
                    os.close(fd)
                kind = "pipe"
            else:
                continue
            with open("/proc/%s/cmdline" % pid, "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        done.add(key)
        log.write(json.dumps({"kind": kind, "argv": [a.decode(errors="replace") for a in argv[:3]]}) + "\n")
        log.flush()
    time.sleep(0.002)
"""


@pytest.fixture
def attacker(make_ct: Callable[..., Container]) -> Iterator[Container]:
    """A container with the daemon running in it as root (it ends when the container is destroyed)."""
    ct = make_ct()
    ct.write_file("/root/attacker.py", ATTACKER)
    ct.sh(f"setsid python3 /root/attacker.py {MARKER} /{ATTACKER_LOG} </dev/null >/dev/null 2>&1 &")
    log = ct.upper_dir / ATTACKER_LOG
    for _ in range(500):  # it opens its log first: from then on it is watching
        if log.exists():
            break
        time.sleep(0.01)
    assert log.exists(), "the attacker did not start"
    yield ct


def reached(ct: Container) -> list[dict[str, object]]:
    """What the attacker wrote its payload into."""
    return [json.loads(line) for line in (ct.upper_dir / ATTACKER_LOG).read_text().splitlines()]


def ran_payload(ct: Container) -> bool:
    return (ct.upper_dir / MARKER).exists()


def test_a_privileged_container_cannot_change_what_its_neighbours_probe_runs(
    lab: Lab, attacker: Container, make_ct: Callable[..., Container],
) -> None:
    # Ten containers on the node, as in the report: the fleet runs eight of a node's at once
    # (fleet.DEFAULT_CHANNELS_PER_NODE), so the last two start after the attacker has had its go at the
    # input its own probe was given, whatever the race within the first eight.
    victims = [make_ct() for _ in range(9)]
    node = lab.node().ssh
    channels = node.session_channels()
    result = run_cli("probe", *host_args(lab, None, attacker.ctid, *(ct.ctid for ct in victims)), "--json")
    assert node.session_channels() - channels == 1, "not the node's batch: this test would not test it"
    reports = {report["ctid"]: report for report in result.json()["targets"]}
    # The attacker did reach its own probe's stdin while the probe ran (so it was there to attack).
    assert any("-s" in entry["argv"] for entry in reached(attacker)), reached(attacker)
    for ct in victims:  # which says nothing: the payload's reports looked as normal as these
        assert reports[ct.ctid]["status"] == "ok", reports[ct.ctid]
    ran = [ct.ctid for ct in victims if ran_payload(ct)]
    assert ran == [], f"containers {ran} ran the payload that CT {attacker.ctid} wrote"


def test_a_privileged_container_cannot_change_what_its_neighbours_apply_runs_or_receives(
    lab: Lab, attacker: Container, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    # The other ways in: a playbook's step script on the stdin of its own channel per container, and a
    # file staged on the node for each container's `pct push` (in the test bed the copy's reader in the
    # container has that staged file as its stdin, which the attacker reopens, so it is in reach here).
    # Neither is shared: what the attacker writes reaches its own container only.
    victims = [make_ct() for _ in range(3)]
    payload_file = tmp_path / "trainer.toml"
    payload_file.write_bytes(b"lr = 0.001\n" * 20000)  # big enough to be still streaming when found
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: cross-guest\nsteps:\n"
        "  - name: config in place\n"
        f"    copy: {{src: {payload_file.name}, dest: /etc/trainer.toml}}\n"
        "  - name: a script on stdin\n"
        "    apply: sleep 1; echo applied\n")
    targets = host_args(lab, None, attacker.ctid, *(ct.ctid for ct in victims))
    result = run_cli("apply", str(book), *targets, "--json", "--state-dir", str(tmp_path / "state"))
    assert reached(attacker), "the attacker found no stdin to write into: this test would not test it"
    ran = [ct.ctid for ct in victims if ran_payload(ct)]
    assert ran == [], f"containers {ran} ran the payload that CT {attacker.ctid} wrote"
    for ct in victims:
        assert (ct.upper_dir / "etc/trainer.toml").read_bytes() == payload_file.read_bytes()
    statuses = {target["target"]: target["status"] for target in result.json()["targets"]}
    assert [status for name, status in statuses.items() if not name.endswith(f"/{attacker.ctid}")] == \
        ["changed"] * len(victims), result.stdout
