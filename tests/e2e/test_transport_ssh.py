"""SSH and pct transports against real OpenSSH sshd instances on loopback (tests/lab/sshd.py).

The node's `pct` here is a tiny shell fake that runs the command on the node itself (CT 999 is stopped,
CT 404 does not exist) and logs its argv: these tests are about the transport, not about containers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetfix.errors import (
    AuthenticationError,
    ChangedHostKeyError,
    ConnectError,
    ConnectionLostError,
    GuestError,
    TransportError,
    UnknownHostKeyError,
)
from fleetfix.fleet import Fleet
from fleetfix.guests.lxc import PctTransport
from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult, NodeTransport, StdinFeed, run_script
from fleetfix.transport.ssh import OPEN_RETRY_DELAYS, SSHConnection
from tests.lab.sshd import SshNode, free_port, keygen, start_node
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sshd in a private mount namespace)"),
]

FAKE_PCT = """#!/bin/sh
printf '%s\\n' "$*" >> /usr/local/sbin/pct.log
[ "$1" = exec ] && [ "$3" = -- ] || { echo "400 not enough arguments" >&2; exit 255; }
case $2 in
  999) echo "container '999' not running!" >&2; exit 255 ;;
  404) echo "Configuration file 'nodes/pve1/lxc/404.conf' does not exist" >&2; exit 255 ;;
esac
shift 3
exec "$@"
"""


@dataclasses.dataclass
class Bed:
    root: Path
    client_key: Path
    client_public_key: str
    known_hosts: Path
    node: SshNode

    def settings(self, node: SshNode | None = None, **changes: object) -> SSHSettings:
        node = node or self.node
        base = SSHSettings(
            node.address, node.port, identity_file=str(self.client_key), known_hosts=str(self.known_hosts),
            connect_timeout=5,
        )
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]

    def start_node(self, name: str, address: str) -> SshNode:
        node = start_node(self.root / name, name=name, address=address,
                          authorized_keys=[self.client_public_key])
        pct = node.sbin_dir / "pct"
        pct.write_text(FAKE_PCT)
        pct.chmod(0o755)
        with self.known_hosts.open("a") as stream:
            stream.write(node.known_hosts_line + "\n")
        return node


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    root = tmp_path_factory.mktemp("transport-bed")
    client_key = root / "client_ed25519"
    public = keygen(client_key, "fleetfix-transport-test")
    known_hosts = root / "known_hosts"
    known_hosts.write_text("")
    bed = Bed(root, client_key, public, known_hosts, node=None)  # type: ignore[arg-type]
    bed.node = bed.start_node("pve1", "127.0.0.1")
    try:
        yield bed
    finally:
        bed.node.stop()


@pytest.fixture(scope="module")
def connection(bed: Bed) -> Iterator[SSHConnection]:
    with SSHConnection(bed.settings()) as conn:
        yield conn


def alive(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def unique_sleep() -> str:
    return f"300.{uuid.uuid4().int % 10**9:09d}"


def host_fingerprint(node: SshNode) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(node.state_dir / "ssh_host_ed25519_key.pub")],
        capture_output=True, text=True, check=True,
    ).stdout
    return out.split()[1]


HOSTILE = (
    "#!/bin/sh\n"
    "q='it'\"'\"'s \"quoted\" $HOME `uname` $(id -u) \\\\ ; | & > < * ? ~ # !'\n"
    'printf "%s\\n" "$q"\n'
    "cat <<'BLOB' | sha256sum\n"
    + "".join(f"line {i}: $(rm -rf /) `reboot` '\"\\ \t%s ${{x}}\n" for i in range(24_000))
    + "BLOB\n"
)


# -- exec over SSH ----------------------------------------------------------------------------------


def test_exec_returns_exit_code_and_separate_streams(connection: SSHConnection) -> None:
    result = NodeTransport(connection).execute(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    assert connection.execute(["true"]).ok


def test_arguments_reach_the_remote_command_verbatim(connection: SSHConnection) -> None:
    words = ["a b", "$(id)", "`id`", "'\"\\", "x\ny", "*", "", "; echo pwned"]
    result = connection.execute(["printf", "[%s]", *words])
    assert result.stdout == "".join(f"[{w}]" for w in words)


def test_hostile_script_runs_verbatim_on_the_node(connection: SSHConnection) -> None:
    assert len(HOSTILE) > 1_000_000
    result = run_script(connection, HOSTILE, timeout=60)
    assert result.exit_code == 0, result.stderr
    quoted, digest = result.stdout.splitlines()
    assert quoted == "it's \"quoted\" $HOME `uname` $(id -u) \\\\ ; | & > < * ? ~ # !"
    blob = HOSTILE.split("<<'BLOB' | sha256sum\n", 1)[1].rsplit("BLOB\n", 1)[0]
    assert digest.split()[0] == hashlib.sha256(blob.encode()).hexdigest()


def test_one_megabyte_each_way(connection: SSHConnection) -> None:
    data = os.urandom(1 << 20)
    # Writes 1 MB before reading stdin: both directions must flow at once.
    result = connection.execute(["sh", "-c", "head -c 1048576 /dev/zero; sha256sum >&2"], stdin=data)
    assert result.exit_code == 0
    assert len(result.stdout) == 1 << 20
    assert result.stderr.split()[0] == hashlib.sha256(data).hexdigest()


def test_a_fed_stdin_reaches_the_node_as_it_is_fed(connection: SSHConnection) -> None:
    # Each line is answered before the next is fed: nothing waits for EOF or for a buffer to fill.
    feed = StdinFeed()
    answers: list[bytes] = []
    answered = threading.Condition()

    def on_output(stream: str, chunk: bytes) -> None:
        with answered:
            answers.append(chunk)
            answered.notify_all()

    result: list[CommandResult] = []
    runner = threading.Thread(target=lambda: result.append(connection.execute_fed(
        ["/bin/sh", "-c", 'while read -r line; do echo "got $line"; done; echo end'], feed,
        on_output=on_output)))
    runner.start()
    for word in ("one", "two", "three"):
        feed.put(f"{word}\n".encode())
        with answered:
            assert answered.wait_for(lambda w=word: f"got {w}\n".encode() in b"".join(answers), 10), word
    feed.close()
    runner.join(10)
    assert result[0].exit_code == 0 and result[0].stdout == "got one\ngot two\ngot three\nend\n"


def test_a_fed_chunk_larger_than_the_window_goes_on_in_order(connection: SSHConnection) -> None:
    # Small chunks go out from the feeding thread; one over the peer's window (OpenSSH's is 2 MiB) cannot
    # without blocking it, so it and every later chunk go through a writer thread, in order.
    feed = StdinFeed()
    chunks = [b"first\n", os.urandom(3 << 20), b"last\n"]
    result: list[CommandResult] = []
    runner = threading.Thread(target=lambda: result.append(connection.execute_fed(["sha256sum"], feed)))
    runner.start()
    for chunk in chunks:
        assert feed.put(chunk)
    feed.close()
    runner.join(30)
    assert result[0].exit_code == 0
    assert result[0].stdout.split()[0] == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_timeout_reports_and_kills_the_remote_command(connection: SSHConnection) -> None:
    marker = unique_sleep()
    started = time.monotonic()
    result = connection.execute(["sh", "-c", f"sleep {marker}; echo never"], timeout=1)
    assert time.monotonic() - started < 4
    assert result.timed_out and result.exit_code == 124 and not result.ok
    assert "never" not in result.stdout
    assert alive(marker) == []
    assert connection.execute(["echo", "still usable"]).stdout == "still usable\n"


def test_a_command_quoting_the_timeout_marker_is_not_a_timeout(connection: SSHConnection) -> None:
    argv = ["sh", "-c", "echo 'fleetfix: timed out after 1s: killing the command' >&2; exit 5"]
    for timeout in (None, 30):
        result = connection.execute(argv, timeout=timeout)
        assert (result.exit_code, result.timed_out) == (5, False)


# -- host keys and authentication --------------------------------------------------------------------


def test_unknown_host_key_is_refused_before_login(bed: Bed) -> None:
    empty = bed.root / "empty_known_hosts"
    empty.write_text("")
    logins = bed.node.connections()
    with pytest.raises(UnknownHostKeyError) as caught:
        SSHConnection(bed.settings(known_hosts=str(empty))).open()
    message = str(caught.value)
    assert f"ssh-ed25519 {host_fingerprint(bed.node)}" in message
    assert "--accept-new" in message and f"ssh-keyscan -p {bed.node.port} 127.0.0.1" in message
    assert bed.node.connections() == logins  # no credential was offered to an unverified host
    assert empty.read_text() == ""


def test_accept_new_records_the_key_and_it_is_trusted_afterwards(bed: Bed) -> None:
    known = bed.root / "fresh" / "known_hosts"
    with SSHConnection(bed.settings(known_hosts=str(known), accept_new=True)) as conn:
        assert conn.execute(["echo", "hi"]).stdout == "hi\n"
    assert known.read_text() == bed.node.known_hosts_line + "\n"
    with SSHConnection(bed.settings(known_hosts=str(known))) as conn:
        assert conn.execute(["echo", "again"]).stdout == "again\n"


def test_changed_host_key_is_refused_even_with_accept_new(bed: Bed) -> None:
    impostor = bed.root / "impostor_key"
    keygen(impostor, "impostor")
    old_key = " ".join(Path(f"{impostor}.pub").read_text().split()[:2])
    known = bed.root / "changed_known_hosts"
    known.write_text(f"[127.0.0.1]:{bed.node.port} {old_key}\n")
    with pytest.raises(ChangedHostKeyError) as caught:
        SSHConnection(bed.settings(known_hosts=str(known), accept_new=True)).open()
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in str(caught.value)
    assert host_fingerprint(bed.node) in str(caught.value)
    assert known.read_text() == f"[127.0.0.1]:{bed.node.port} {old_key}\n"


def test_wrong_client_key_is_an_authentication_error(bed: Bed) -> None:
    stranger = bed.root / "stranger_key"
    keygen(stranger, "stranger")
    with pytest.raises(AuthenticationError, match=f"root@127.0.0.1:{bed.node.port}: authentication rejected"):
        SSHConnection(bed.settings(identity_file=str(stranger))).open()


def test_encrypted_key_with_passphrase_from_env(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    path = bed.root / "encrypted_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "pass phrase", "-f", str(path)], check=True)
    node = bed.start_node("enc", "127.0.0.4")
    try:
        (node.state_dir / "authorized_keys").write_text(Path(f"{path}.pub").read_text())
        monkeypatch.setenv("FLEETFIX_SSH_PASSPHRASE", "pass phrase")
        with SSHConnection(bed.settings(node, identity_file=str(path))) as conn:
            assert conn.execute(["echo", "ok"]).stdout == "ok\n"
    finally:
        node.stop()


def test_agent_key_is_used_without_an_identity_file(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path = bed.root / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        wait_for(socket_path.exists, 5, "ssh-agent's socket")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        subprocess.run(["ssh-add", "-q", str(bed.client_key)], check=True, capture_output=True)
        with SSHConnection(bed.settings(identity_file=None)) as conn:
            assert conn.execute(["echo", "agent"]).stdout == "agent\n"
    finally:
        agent.terminate()
        agent.wait(timeout=5)


def test_refused_port_is_a_quick_connect_error(bed: Bed) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectError, match=f"127.0.0.1:{port}: connection refused"):
        SSHConnection(bed.settings(port=port, connect_timeout=30)).open()
    assert time.monotonic() - started < 10  # well before the 30 s timeout: refused is not waited for


class DroppableProxy:
    """A loopback TCP forwarder to a node whose link can be cut mid-stream (both sockets reset)."""

    def __init__(self, node: SshNode) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.node = node
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection((self.node.address, self.node.port))
        self.sockets += [client, upstream]
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    def drop(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.listener.close()


def test_connection_dropped_mid_command_is_connection_lost(bed: Bed) -> None:
    proxy = DroppableProxy(bed.node)
    # Through the proxy's socket, while the host key is checked for the node's own address:port.
    conn = SSHConnection(
        bed.settings(), sock_factory=lambda _s: socket.create_connection(("127.0.0.1", proxy.port))
    ).open()
    marker = unique_sleep()
    try:
        threading.Timer(0.5, proxy.drop).start()
        started = time.monotonic()
        with pytest.raises(ConnectionLostError, match=f"127.0.0.1:{bed.node.port}"):
            conn.execute(["sleep", marker])
        assert time.monotonic() - started < 5
    finally:
        conn.close()
        for pid in alive(marker):  # the node side never learnt the link died: end our sleep, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


# -- pct over the node's connection, and the fleet runner -----------------------------------------------


def test_two_containers_share_one_tcp_connection(bed: Bed) -> None:
    logins, channels = bed.node.connections(), bed.node.session_channels()
    ref = NodeRef("pve1", bed.settings())
    targets = [Target("pve1/200", ref, GuestRef.lxc(200)), Target("pve1/201", ref, GuestRef.lxc(201))]
    with Fleet() as fleet:
        outcomes = fleet.map(targets, lambda t, tr: tr.execute(["sh", "-c", f"echo {t.guest.id} $container"]))
        node_facts = fleet.node_transport(targets[0]).execute(["sh", "-c", "echo node ${container-none}"])
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert [o.value.stdout if o.value else None for o in outcomes] == ["200 lxc\n", "201 lxc\n"]
    assert node_facts.stdout == "node none\n"
    assert bed.node.connections() - logins == 1  # containers and node facts: one TCP connection
    assert bed.node.session_channels() - channels == 3  # one exec channel each
    log = (bed.node.sbin_dir / "pct.log").read_text().splitlines()
    assert any(line.startswith("exec 200 -- env -i PATH=") for line in log)


def test_stopped_and_missing_containers(bed: Bed, connection: SSHConnection) -> None:
    with pytest.raises(GuestError, match=r"^CT 999 on pve1 is stopped$"):
        PctTransport(connection, 999, node_name="pve1").execute(["true"])
    with pytest.raises(GuestError, match=r"^CT 404 does not exist on pve1$"):
        PctTransport(connection, 404, node_name="pve1").execute(["true"])
    ref = NodeRef("pve1", bed.settings())
    outcomes = Fleet().map([Target("pve1/999", ref, GuestRef.lxc(999))], lambda _t, tr: tr.execute(["true"]))
    assert (outcomes[0].status, str(outcomes[0].error)) == ("unreachable", "CT 999 on pve1 is stopped")


def test_hostile_script_and_timeout_through_pct(connection: SSHConnection) -> None:
    ct = PctTransport(connection, 200, node_name="pve1")
    result = run_script(ct, HOSTILE, timeout=60)
    blob = HOSTILE.split("<<'BLOB' | sha256sum\n", 1)[1].rsplit("BLOB\n", 1)[0]
    assert result.stdout.splitlines()[1].split()[0] == hashlib.sha256(blob.encode()).hexdigest()
    marker = unique_sleep()
    result = ct.execute(["sleep", marker], timeout=1)
    assert result.timed_out
    assert alive(marker) == []


def test_unreachable_node_is_connected_once_for_all_its_targets(bed: Bed) -> None:
    ref = NodeRef("gone", bed.settings(port=free_port()))
    targets = [Target(f"gone/{i}", ref, GuestRef.lxc(i)) for i in range(5)]
    outcomes = Fleet().map(targets, lambda _t, tr: tr.execute(["true"]))
    assert {o.status for o in outcomes} == {"unreachable"}
    assert len({str(o.error) for o in outcomes}) == 1


def test_jump_host(bed: Bed) -> None:
    target_node = bed.start_node("behind", "127.0.0.3")
    try:
        settings = bed.settings(target_node, jump_host=f"root@127.0.0.1:{bed.node.port}")
        with SSHConnection(settings) as conn:
            assert conn.execute(["echo", "through the bastion"]).stdout == "through the bastion\n"
        assert target_node.connections() == 1
        assert f"target 127.0.0.3 port {target_node.port}" in bed.node.log_text()  # the bastion forwarded
    finally:
        target_node.stop()


# -- MaxSessions ------------------------------------------------------------------------------------------


def test_twenty_concurrent_commands_on_one_connection_all_succeed(bed: Bed) -> None:
    # Default: 8 channels at once, under sshd's MaxSessions=10.
    with SSHConnection(bed.settings()) as conn, ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda i: conn.execute(["sh", "-c", f"sleep 0.3; echo {i}"]), range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]


def test_without_the_channel_limit_sshd_refuses_sessions(bed: Bed) -> None:
    """The control for the test above: the limit is what makes 20 concurrent commands work. The commands
    outlast every retry of a refused open (OPEN_RETRY_DELAYS), so the refusals surface."""
    assert sum(OPEN_RETRY_DELAYS) < 2.5
    with SSHConnection(bed.settings(), max_channels=20) as conn:

        def attempt(i: int) -> str:
            try:
                return conn.execute(["sh", "-c", "sleep 4"]).stdout
            except TransportError as error:
                return f"refused: {error}"

        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(attempt, range(20)))
    assert any(answer.startswith("refused: ") for answer in answers)


def test_a_refused_channel_open_is_retried_once_sessions_free_up(bed: Bed) -> None:
    """12 at once over MaxSessions=10: the two refused opens are retried and get in when the first ten
    (short commands) have closed; every command runs once."""
    marker = f"fleetfix-retry-{uuid.uuid4().hex[:8]}"
    with SSHConnection(bed.settings(), max_channels=12) as conn, ThreadPoolExecutor(12) as pool:
        results = list(pool.map(
            lambda i: conn.execute(["sh", "-c", f"sleep 0.2; echo {i} >> /tmp/{marker}; echo {i}"]), range(12)
        ))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]
    ran = Path(f"/tmp/{marker}").read_text().split()
    Path(f"/tmp/{marker}").unlink()
    assert sorted(ran, key=int) == [str(i) for i in range(12)]


def test_an_eof_overtaken_by_the_close_is_not_sent(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko builds a channel's EOF under the channel's lock and sends it after releasing it. If the
    command has exited meanwhile, the transport thread answers sshd's CLOSE first, sshd frees the channel,
    and a late EOF makes it drop the whole connection ("packet referred to nonexistent channel"): seen
    once in CI in the test below. Here the EOF is held back until the close has happened, every time."""
    import paramiko

    def late_shutdown_write(channel: paramiko.Channel) -> None:
        with channel.lock:
            message = channel._send_eof()  # what paramiko's shutdown_write does, then the gap, widened
        wait_for(lambda: channel.closed, 10, "the channel's close")  # the exit and CLOSE come, CLOSE goes
        if message is not None:
            channel.transport._send_user_message(message)

    monkeypatch.setattr(paramiko.Channel, "shutdown_write", late_shutdown_write)
    with SSHConnection(bed.settings()) as conn:
        assert [conn.execute(["echo", str(i)]).stdout for i in range(3)] == ["0\n", "1\n", "2\n"]


def test_back_to_back_commands_at_max_sessions_all_succeed(bed: Bed) -> None:
    """With as many slots as MaxSessions (10), sshd refuses some opens: it frees a closed session only after
    it has read the next open (~20 of 200 here). The retry makes every command run anyway."""
    with SSHConnection(bed.settings(), max_channels=10) as conn, ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda i: conn.execute(["echo", str(i)]), range(200)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(200)]
