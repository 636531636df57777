"""SSH to a node with paramiko: one connection per node, many exec channels on it, errors mapped at the seam.

`SSHConnection` owns one paramiko `Transport` (one TCP connection) and is safe to share between threads:
every `execute` opens its own session channel, and a semaphore keeps the number of open channels under the
server's MaxSessions (OpenSSH default 10, so 8 here). A target holds it through `base.NodeTransport`,
which forwards to it under the target's name.

No paramiko or socket exception leaves this module: they become `fleetfix.errors.TransportError` subclasses.

Files (`upload`/`download`/`remove`) go over SFTP on the same connection: one more session channel (under
the same channel limit) with the `sftp` subsystem, which every Debian/PVE sshd enables by default
(`Subsystem sftp /usr/lib/openssh/sftp-server`). Why SFTP rather than `cat > file` on an exec channel:
the bytes never pass through a shell or our command-result path (which decodes text and keeps it in
memory); SFTP streams with its own flow control and pipelined writes, reports errors per operation
(ENOENT, EACCES, ENOSPC) instead of as a shell's stderr, and can create a file exclusively. The checksum
on both ends (`fleetfix.guests.transfer`) is end-to-end either way.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, BinaryIO

from fleetfix.errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    ConnectionLostError,
    ConnectRefusedError,
    ConnectTimeoutError,
    FleetfixError,
    KeyPermissionError,
    NameResolutionError,
    TransferError,
    TransportError,
    one_line,
)
from fleetfix.target import SSHSettings
from fleetfix.transport._paramiko import (
    AuthenticationException,
    BadAuthenticationType,
    ChannelException,
    PasswordRequiredException,
    SSHException,
    UnknownKeyType,
    paramiko,
)
from fleetfix.transport.base import (
    DEFAULT_MAX_OUTPUT,
    FED_RESULT_OUTPUT,
    TIMEOUT_EXIT_CODE,
    CappedOutput,
    CommandResult,
    OutputSink,
    StdinFeed,
    Transferred,
    command_line,
    copy_stream,
)
from fleetfix.transport.dial import CLIENT_VERSION, DialledSocket, dial
from fleetfix.transport.hostkeys import KnownHosts, known_hosts_name
from fleetfix.transport.remote import TIMEOUT_MARKER, with_watchdog

# paramiko logs some failures (e.g. a refused channel) at ERROR; with no handler configured, Python would
# print them to stderr. They reach the user as TransportError messages instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_MAX_CHANNELS = 8  # below OpenSSH's MaxSessions=10, leaving room for an interactive admin
# An SFTP request unanswered this long fails the transfer: a hung node, not a slow one (each request is at
# most 32 KiB; a node that moves nothing for two minutes is not going to finish).
SFTP_IDLE_TIMEOUT = 120.0
PASSPHRASE_ENV = "FLEETFIX_SSH_PASSPHRASE"
# After our deadline, how long to wait for the remote watchdog's kill to close the channel: it counts whole
# seconds from the remote start, so it fires up to a second plus one round trip after the local deadline.
KILL_GRACE_SECONDS = 3.0
# A refused or unanswered channel open is retried after these pauses. sshd frees a closed session only in
# a later pass of its main loop, so a new open that arrives with (or just after) the close of another can
# be refused ("no more sessions") even below MaxSessions; under load it may also answer an open late.
OPEN_RETRY_DELAYS = (0.1, 0.3, 1.0)
_CHUNK = 65536
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


def parse_jump_host(spec: str, *, default_user: str) -> tuple[str, str, int]:
    """ "user@host:port" (user and port optional, IPv6 as [addr]:port) → (user, host, port)."""
    match = re.fullmatch(r"(?:([^@\s]+)@)?(\[[^\]\s]+\]|[^:@\s\[\]]+)(?::(\d{1,5}))?", spec.strip())
    if not match:
        raise ConfigError(f"invalid jump host {spec!r}: expected [user@]host[:port]", field="jump_host")
    user, host, port = match.groups()
    return user or default_user, host.strip("[]"), int(port or 22)


class SSHConnection:
    """One authenticated SSH connection to a node, shared by all commands (and containers) on that node."""

    def __init__(
        self, settings: SSHSettings, *, max_channels: int = DEFAULT_MAX_CHANNELS, label: str | None = None,
        sock_factory: Callable[[SSHSettings], Any] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
        dialled: DialledSocket | None = None,
    ) -> None:
        """sock_factory: returns a connected socket-like object to use instead of dialling the node
        (e.g. a latency-adding proxy in benchmarks); the host key is still checked for address:port.
        dialled: the node's connection from `dial.dial()`, made before paramiko was imported (used once)."""
        if max_channels < 1:
            raise ValueError("max_channels must be at least 1")
        self.settings = settings
        self.label = label or f"{settings.user}@{settings.address}:{settings.port}"
        self.endpoint = f"{settings.address}:{settings.port}"
        self.max_channels = max_channels
        self.sock_factory = sock_factory
        self.max_output = max_output  # per stream per command: see transport.base.CappedOutput
        self._channel_slots = threading.BoundedSemaphore(max_channels)
        self._open_lock = threading.Lock()
        self._transport: paramiko.Transport | None = None
        self._bastion: SSHConnection | None = None
        self._dialled = dialled
        self._closed = False

    # -- connection lifecycle -------------------------------------------------------------------------

    def open(self) -> SSHConnection:
        """Connect, verify the host key, authenticate. Idempotent and thread-safe; returns self."""
        with self._open_lock:
            if self._transport is not None:
                return self
            if self._closed:
                raise ConnectionLostError(f"{self.endpoint}: connection already closed")
            sock = self._open_socket()
            try:
                self._transport = self._handshake(sock)
            except BaseException:
                sock.close()
                if self._bastion is not None:
                    self._bastion.close()
                raise
            return self

    @property
    def is_open(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    def close(self) -> None:
        with self._open_lock:
            self._closed = True
            transport, self._transport = self._transport, None
        if transport is not None:
            # Shut the socket down first: paramiko's thread, blocked reading it, ends now instead of at its
            # next read timeout, so a Fleet that closes nodes as it goes keeps no trail of ending threads.
            with contextlib.suppress(Exception):
                transport.sock.shutdown(socket.SHUT_RDWR)
            transport.close()
        if self._bastion is not None:
            self._bastion.close()

    def __enter__(self) -> SSHConnection:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _open_socket(self) -> Any:
        """A connected TCP socket, or a direct-tcpip channel through the jump host."""
        s = self.settings
        if s.jump_host:
            return self._tunnel_through_jump_host(s.jump_host)
        if self._dialled is not None:
            dialled, self._dialled = self._dialled, None
            return dialled
        if self.sock_factory is None:
            return dial(s)  # our identification line goes out with the connection (transport/dial.py)
        try:
            return self.sock_factory(s)
        except socket.gaierror as error:
            raise NameResolutionError(f"{self.endpoint}: cannot resolve host: {error.strerror}") from None
        except TimeoutError:
            raise ConnectTimeoutError(
                f"{self.endpoint}: connect timed out after {s.connect_timeout:g}s"
            ) from None
        except ConnectionRefusedError:
            raise ConnectRefusedError(f"{self.endpoint}: connection refused") from None
        except OSError as error:
            raise ConnectError(f"{self.endpoint}: {error.strerror or one_line(error)}") from None

    def _tunnel_through_jump_host(self, spec: str) -> paramiko.Channel:
        s = self.settings
        user, host, port = parse_jump_host(spec, default_user=s.user)
        bastion_settings = replace(s, address=host, port=port, user=user, jump_host=None)
        self._bastion = SSHConnection(
            bastion_settings, max_channels=1, label=f"jump host {user}@{host}:{port}"
        )
        try:
            self._bastion.open()
        except TransportError as error:
            raise type(error)(f"{self.endpoint} via jump host: {error}") from None
        transport = self._bastion._transport
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (s.address, s.port), ("127.0.0.1", 0), timeout=s.connect_timeout
            )
        except ChannelException as error:
            self._bastion.close()
            raise ConnectError(
                f"{self.endpoint}: jump host {host}:{port} could not connect: {error.text}"
            ) from None
        except (SSHException, EOFError, OSError) as error:
            self._bastion.close()
            raise ConnectError(f"{self.endpoint} via jump host {host}:{port}: {one_line(error)}") from None

    def _handshake(self, sock: Any) -> paramiko.Transport:
        s = self.settings
        known_hosts = KnownHosts(s.known_hosts)
        transport = _QuietTransport(sock)
        # One identification line whichever way the socket came; a DialledSocket has sent it already.
        transport.local_version = CLIENT_VERSION
        transport.banner_timeout = s.connect_timeout  # paramiko's default is 15 s, whatever we ask for
        try:
            options = transport.get_security_options()
            options.key_types = known_hosts.preferred_algorithms(
                s.address, s.port, tuple(options.key_types)
            )
            options.ciphers = prefer_aead_ciphers(tuple(options.ciphers))
            transport.start_client(timeout=s.connect_timeout)
            if not transport.is_active() or not transport.initial_kex_done:
                raise ConnectTimeoutError(
                    f"{self.endpoint}: SSH handshake timed out after {s.connect_timeout:g}s"
                )
            server_key = transport.get_remote_server_key()
        except (SSHException, EOFError, OSError) as error:
            transport.close()
            raise ConnectError(f"{self.endpoint}: SSH handshake failed: {one_line(error)}") from None
        except ConnectError:
            transport.close()
            raise
        try:
            # Before authenticating: never offer a credential to a host we do not trust.
            known_hosts.verify(s.address, s.port, server_key, accept_new=s.accept_new)
            self._authenticate(transport)
        except BaseException:
            transport.close()
            raise
        if s.keepalive > 0:
            transport.set_keepalive(max(1, round(s.keepalive)))
        return transport

    # -- authentication -------------------------------------------------------------------------------

    def _authenticate(self, transport: paramiko.Transport) -> None:
        s = self.settings
        who = f"{s.user}@{self.endpoint}"
        agent: paramiko.Agent | None = None
        try:
            candidates: list[tuple[str, paramiko.PKey]]
            if s.identity_file:
                candidates = [(s.identity_file, load_private_key(s.identity_file))]
            else:
                agent = _open_agent()
                candidates = [("agent key " + k.fingerprint, k) for k in (agent.get_keys() if agent else ())]
                candidates += _default_identities()
            if not candidates:
                raise AuthenticationError(
                    f"{who}: no SSH key to offer (set an identity file, or add a key to ssh-agent)"
                )
            for _, key in candidates:
                try:
                    remaining = transport.auth_publickey(s.user, key)
                except BadAuthenticationType as error:
                    raise AuthenticationError(
                        f"{who}: server does not accept public-key login "
                        f"(it allows: {', '.join(error.allowed_types) or 'nothing'})"
                    ) from None
                except AuthenticationException:
                    continue
                if transport.is_authenticated():
                    return
                raise AuthenticationError(
                    f"{who}: server asks for more authentication ({', '.join(remaining)}); not supported"
                )
            tried = ", ".join(name for name, _ in candidates)
            raise AuthenticationError(f"{who}: authentication rejected for key(s): {tried}")
        except (SSHException, EOFError, OSError) as error:
            raise ConnectError(f"{self.endpoint}: connection lost during login: {one_line(error)}") from None
        finally:
            if agent is not None:
                agent.close()

    # -- commands -------------------------------------------------------------------------------------

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        """Run argv on the node (quoted once, here). Opens the connection on first use. on_output sees
        each chunk as it is received.

        With a timeout, the command runs under the remote watchdog (see `remote.py`), so a timed-out
        command is killed on the node, and the result has timed_out=True and exit code 124.
        """
        return self._execute(argv, stdin, timeout, on_output, self.max_output)

    def execute_fed(self, argv: Sequence[str], feed: StdinFeed, *, timeout: float | None = None,
                    on_output: OutputSink | None = None) -> CommandResult:
        """Run argv with stdin written as it is fed (`transport.base.FeedableTransport`)."""
        try:
            return self._execute(argv, feed, timeout, on_output, FED_RESULT_OUTPUT)
        finally:
            feed.close()  # also when no channel could be opened

    def _execute(self, argv: Sequence[str], stdin: bytes | StdinFeed, timeout: float | None,
                 on_output: OutputSink | None, max_output: int) -> CommandResult:
        line = command_line(with_watchdog(argv, timeout))
        self.open()
        with self._channel_slots:
            try:
                return self._run(line, stdin, timeout, argv[0], on_output, max_output)
            except FleetfixError:
                raise
            except (SSHException, EOFError, OSError) as error:
                raise ConnectionLostError(f"{self.endpoint}: {one_line(error)}") from None

    # -- files (SFTP) ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _sftp(self, what: str) -> Iterator[paramiko.SFTPClient]:
        """An SFTP session on its own channel (counted like an exec), with library errors mapped: a lost
        link is ConnectionLostError, anything the server refused a TransferError naming `what`."""
        self.open()
        with self._channel_slots:
            transport = self._transport
            if transport is None or not transport.is_active():
                raise ConnectionLostError(f"{self.endpoint}: SSH connection is closed")
            channel = self._open_session(transport)
            try:
                channel.settimeout(SFTP_IDLE_TIMEOUT)
                try:
                    channel.invoke_subsystem("sftp")
                    client = paramiko.SFTPClient(channel)
                except (SSHException, EOFError) as error:
                    if not transport.is_active():
                        raise ConnectionLostError(f"{self.endpoint}: {one_line(error)}") from None
                    raise TransferError(
                        f"{self.endpoint}: the node refused the sftp subsystem ({one_line(error)}): "
                        "enable `Subsystem sftp` in its sshd_config") from None
                try:
                    yield client
                finally:
                    with contextlib.suppress(Exception):
                        client.close()
            except FleetfixError:
                raise
            except TimeoutError:
                raise TransferError(
                    f"{self.endpoint}: {what}: no progress for {SFTP_IDLE_TIMEOUT:g}s") from None
            except (SSHException, EOFError, OSError) as error:
                if not transport.is_active() or not isinstance(error, OSError) or error.errno is None:
                    raise ConnectionLostError(f"{self.endpoint}: {what}: {one_line(error)}") from None
                reason = error.strerror or os.strerror(error.errno)
                raise TransferError(f"{self.endpoint}: {what}: {reason}") from None
            finally:
                channel.close()

    def upload(self, source: BinaryIO, path: str, *, mode: int = 0o600, max_bytes: int) -> Transferred:
        """Create path exclusively on the node (mode set before any byte is written) and stream source
        into it, pipelined; a failure removes the partial file."""
        with self._sftp(f"upload to {path}") as sftp:
            handle = sftp.open(path, "wbx")
            try:
                handle.chmod(mode)  # before the first byte: the content is never readable under a wider mode
                handle.set_pipelined(True)
                moved = copy_stream(source.read, handle.write, max_bytes=max_bytes, what=path)
                handle.close()  # waits for every pipelined write's status: ENOSPC surfaces here
            except BaseException:
                with contextlib.suppress(Exception):
                    handle.close()
                with contextlib.suppress(Exception):
                    sftp.remove(path)
                raise
            return moved

    def download(self, path: str, sink: BinaryIO, *, max_bytes: int) -> Transferred:
        """Stream a node file into sink, with read-ahead; TransferError when it is over max_bytes."""
        with self._sftp(f"download of {path}") as sftp, sftp.open(path, "rb") as handle:
            size = handle.stat().st_size
            if size is not None and size > max_bytes:
                raise TransferError(f"{path}: {size} bytes, over the limit of {max_bytes}")
            handle.prefetch(size)
            return copy_stream(handle.read, sink.write, max_bytes=max_bytes, what=path)

    def remove(self, path: str) -> None:
        with self._sftp(f"removing {path}") as sftp:
            try:
                sftp.remove(path)
            except OSError as error:
                if error.errno != errno.ENOENT:
                    raise

    def _open_session(self, transport: paramiko.Transport) -> paramiko.Channel:
        """A new session channel; a refusal or a timeout is retried (OPEN_RETRY_DELAYS) while the connection
        is up, because at fleet scale both are transient: see the 1000-target run in docs/performance.md."""
        for delay in (*OPEN_RETRY_DELAYS, None):
            try:
                return transport.open_session(timeout=self.settings.connect_timeout)
            except ChannelException as error:
                failure = TransportError(f"{self.endpoint}: server refused a new channel: {error.text}")
            except (SSHException, EOFError, OSError) as error:
                reason = one_line(error)
                if not transport.is_active():
                    raise ConnectionLostError(f"{self.endpoint}: connection lost: {reason}") from None
                failure = TransportError(f"{self.endpoint}: could not open a channel: {reason}")
            if delay is None or not transport.is_active():
                raise failure
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _run(
        self, line: str, stdin: bytes | StdinFeed, timeout: float | None, program: str,
        on_output: OutputSink | None, max_output: int,
    ) -> CommandResult:
        started = time.monotonic()
        transport = self._transport
        if transport is None or not transport.is_active():
            raise ConnectionLostError(f"{self.endpoint}: SSH connection is closed")
        channel = self._open_session(transport)
        writer: _StdinWriter | None = None
        try:
            wakeup = channel.fileno()  # a pipe paramiko sets on stdout/stderr data and on close
            channel.exec_command(line)
            writer = _send_stdin(channel, stdin)
            deadline = None if timeout is None else started + timeout
            out, err, finished = _collect(channel, wakeup, deadline, KILL_GRACE_SECONDS, on_output,
                                          max_output)
        finally:
            channel.close()
            if isinstance(stdin, StdinFeed):
                stdin.close()  # the command ended: its writer stops waiting for more, before the join
            if writer is not None:
                writer.join(timeout=5)
        duration = time.monotonic() - started
        dropped = out.dropped + err.dropped
        stdout, stderr = out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
        # -1: no exit-status came. sshd sends exit-signal instead when the command died of a signal (the
        # watchdog's SIGKILL, or any other), and paramiko does not parse that message.
        # The watchdog SIGKILLs the whole session, so its kill never comes with an exit status: a status
        # means the command ended on its own, even if it printed something that looks like our marker.
        status = channel.exit_status if channel.status_event.is_set() else -1
        if finished and status != -1:
            return CommandResult(status, stdout, stderr, duration, dropped=dropped)
        if not transport.is_active():
            raise ConnectionLostError(f"{self.endpoint}: connection lost while running {program}")
        watchdog_fired = _has_timeout_marker(stderr)
        if timeout is not None and (not finished or watchdog_fired or duration >= timeout):
            return CommandResult(TIMEOUT_EXIT_CODE, stdout, stderr, duration, timed_out=True, dropped=dropped)
        return CommandResult(-1, stdout, stderr, duration, dropped=dropped)


# The channel whose stdin this thread is sending, for _QuietTransport._send_message.
_stdin_sender = threading.local()


class _QuietTransport(paramiko.Transport):
    """paramiko's Transport, its thread waking once a second instead of ten times when the link is idle,
    and never sending a channel's stdin after that channel's close (`_send_message`).

    Why: the thread polls its socket with a timeout only to notice a local close or a due keepalive, and
    ten wake-ups a second per idle connection add up: a fleet probe holds one connection per node open
    while the containers work, so those wake-ups were most of the controller's CPU per container
    (docs/performance.md). Nothing here needs the short poll: data and a remote close wake the thread at
    once, keepalives are whole seconds, and close() does not wait for the thread.
    """

    _active_check_timeout = 1.0

    def _send_message(self, data: Any) -> None:
        # A channel's stdin or EOF, lost in a race with its close, is dropped instead of sent: paramiko
        # builds a DATA/EOF message under the channel's lock but sends it after releasing it, so the CLOSE
        # this thread's transport answers a remote close with (the command exited) can go out first. sshd
        # then frees the channel, and a DATA/EOF after it makes sshd drop the whole connection ("packet
        # referred to nonexistent channel"): every other command on the node with it. Seen in CI with 200
        # back-to-back commands. User messages are sent in order under clear_to_send_lock, held here, and
        # paramiko sets `closed` before it sends the CLOSE, so this check cannot be overtaken.
        channel = getattr(_stdin_sender, "channel", None)
        if channel is not None and channel.closed:
            return
        super()._send_message(data)  # type: ignore[misc]  # private, not in types-paramiko


def prefer_aead_ciphers(available: tuple[str, ...]) -> tuple[str, ...]:
    """AES-GCM first, the rest (paramiko's order) as fallback for servers without it.

    Why: with AES-CTR paramiko checks each packet's HMAC in a pure-Python loop; GCM authenticates inside
    `cryptography`. Each exec channel is a dozen packets, so this is ~25% of the controller CPU per packet
    (benchmarks/, docs/performance.md). OpenSSH has offered aes128-gcm@openssh.com since 6.2.
    """
    aead = tuple(name for name in AEAD_CIPHERS if name in available)
    return aead + tuple(name for name in available if name not in aead)


def _has_timeout_marker(stderr: str) -> bool:
    return any(line.startswith(TIMEOUT_MARKER) for line in stderr.splitlines())


def _send_stdin(channel: paramiko.Channel, data: bytes | StdinFeed) -> _StdinWriter:
    """Send stdin then EOF. Inline when it fits the peer's window (never blocks), else from a thread, so a
    command that writes a lot before it reads cannot deadlock against us. A fed stdin likewise, chunk by
    chunk, from the thread that feeds it."""
    writer = _StdinWriter(channel, data)
    if isinstance(data, StdinFeed):
        data.send_directly(writer.send_now)
    elif writer.send_now(data):
        writer.send_now(None)
    return writer


class _StdinWriter:
    """A channel's stdin: sent by the caller's thread while each chunk fits the peer's window, else by a
    thread of its own from that chunk on. Why for a fed stdin: a writer thread per node batch, woken once
    per container, made thread wake-ups a visible share of a large probe's CPU (docs/performance.md)."""

    def __init__(self, channel: paramiko.Channel, data: bytes | StdinFeed) -> None:
        self._channel = channel
        self._data = data
        self._thread: threading.Thread | None = None

    def send_now(self, chunk: bytes | None) -> bool:
        """Send chunk (None: EOF) now; False, and the thread started for it and the rest, when it could
        block."""
        if chunk is not None and len(chunk) > self._channel.out_window_size:
            self._thread = threading.Thread(target=self._send_all, daemon=True)
            self._thread.start()
            return False
        _send(self._channel, chunk)
        return True

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _send_all(self) -> None:
        for chunk in (self._data,) if isinstance(self._data, bytes) else self._data:
            _send(self._channel, chunk)
        _send(self._channel, None)


def _send(channel: paramiko.Channel, chunk: bytes | None) -> None:
    """Send a chunk of stdin, or EOF for None."""
    _stdin_sender.channel = channel
    try:
        if chunk is None:
            channel.shutdown_write()
        elif chunk:
            channel.sendall(chunk)
    except (OSError, EOFError, SSHException):
        pass  # the command exited without reading everything: its result says what happened
    finally:
        _stdin_sender.channel = None


def _collect(
    channel: paramiko.Channel, wakeup: int, deadline: float | None, grace: float,
    on_output: OutputSink | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
) -> tuple[CappedOutput, CappedOutput, bool]:
    """Read stdout and stderr as they come (each chunk also to on_output) until EOF and exit status, each
    kept within max_output; False as the third value when the deadline (plus grace for the remote kill to
    land) passed first."""
    out, err = CappedOutput(max_output), CappedOutput(max_output)
    poller = select.poll()
    poller.register(wakeup, select.POLLIN)
    give_up = None if deadline is None else deadline + grace
    while True:
        while channel.recv_ready():
            chunk = channel.recv(_CHUNK)
            out.add(chunk)
            if on_output is not None and chunk:
                on_output("stdout", chunk)
        while channel.recv_stderr_ready():
            chunk = channel.recv_stderr(_CHUNK)
            err.add(chunk)
            if on_output is not None and chunk:
                on_output("stderr", chunk)
        if channel.closed or (channel.eof_received and channel.status_event.is_set()):
            return out, err, True
        remaining = None if give_up is None else give_up - time.monotonic()
        if remaining is not None and remaining <= 0:
            return out, err, False
        if channel.eof_received:  # output done; only the exit status is still to come
            channel.status_event.wait(remaining)
        else:
            poller.poll(None if remaining is None else max(1, int(remaining * 1000)))


def check_key_permissions(path: str, full_path: str) -> None:
    """Refuse a private key that others may access, as OpenSSH does (authfile.c, sshkey_perm_ok): a key
    owned by this user with any group or other permission bit (mode & 077) is ignored with its message.
    A key owned by someone else is not checked, as in OpenSSH."""
    try:
        info = os.stat(full_path)
    except OSError:
        return  # loading says what is wrong with it
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        raise KeyPermissionError(
            f"identity file {path}: WARNING: UNPROTECTED PRIVATE KEY FILE! Permissions "
            f"0{info.st_mode & 0o777:03o} for '{path}' are too open. It is required that your private key "
            "files are NOT accessible by others. This private key will be ignored.")


def load_private_key(path: str) -> paramiko.PKey:
    """An ed25519/ecdsa/rsa private key; its passphrase, if any, from $FLEETFIX_SSH_PASSPHRASE.

    Loaded once per process while the file stays the same (its stat stamp), and a failure is kept the same
    way: every node's connection asks for the key, and an encrypted one would pay its KDF (bcrypt, with
    ssh-keygen's default 16 rounds, is deliberately slow) once per node, or fail with the same message once
    per node.
    """
    passphrase = os.environ.get(PASSPHRASE_ENV) or None
    full_path = os.path.expanduser(path)
    check_key_permissions(path, full_path)
    try:
        info = os.stat(full_path)
    except OSError:
        return _load_private_key(path, full_path, passphrase)  # it says what is wrong with the file
    # The passphrase only as a digest: what a cache holds need not be a secret too.
    secret = hashlib.sha256(passphrase.encode()).digest() if passphrase else b""
    stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, secret)
    with _keys_lock:  # concurrent first connects wait for one load instead of each paying the KDF
        cached = _keys.get(path)
        if cached is None or cached[0] != stamp:
            try:
                cached = (stamp, _load_private_key(path, full_path, passphrase))
            except AuthenticationError as error:
                cached = (stamp, error)
            _keys[path] = cached
    if isinstance(cached[1], AuthenticationError):
        raise AuthenticationError(str(cached[1]))
    return cached[1]


# Loaded identity files: the path as given -> (the expanded file's stat stamp and the passphrase's digest,
# the key or why it failed).
_KeyStamp = tuple[int, int, int, int, bytes]
_keys: dict[str, tuple[_KeyStamp, paramiko.PKey | AuthenticationError]] = {}
_keys_lock = threading.Lock()


def _load_private_key(path: str, full_path: str, passphrase: str | None) -> paramiko.PKey:
    try:
        # bytes: paramiko 5 hands it to `cryptography`, which rejects str with a TypeError.
        password: Any = passphrase.encode() if passphrase else None  # the stubs say str; bytes works
        # Positional: paramiko 5 renamed the keyword (`passphrase` up to 4.x, `password` since).
        return paramiko.PKey.from_path(full_path, password)
    except FileNotFoundError:
        raise AuthenticationError(f"identity file {path} does not exist") from None
    except PermissionError:
        raise AuthenticationError(f"identity file {path} is not readable") from None
    except (PasswordRequiredException, TypeError, SSHException, ValueError, UnknownKeyType) as error:
        # The file itself says whether it is encrypted: paramiko and cryptography releases each word (and
        # type) "no passphrase given" differently (PasswordRequiredException, TypeError, ValueError).
        if passphrase is None and key_file_is_encrypted(full_path):
            raise AuthenticationError(
                f"identity file {path} is encrypted: set {PASSPHRASE_ENV} or load the key into ssh-agent"
            ) from None
        if isinstance(error, TypeError):  # not a key problem: a bug, shown as one
            raise
        reason = "wrong passphrase or unreadable key" if passphrase else one_line(error)
        raise AuthenticationError(f"cannot load identity file {path}: {reason}") from None


def key_file_is_encrypted(path: str) -> bool:
    """Whether a private key file is passphrase-protected: PEM's `Proc-Type: 4,ENCRYPTED`, PKCS#8's
    `ENCRYPTED PRIVATE KEY`, or an OpenSSH key whose cipher is not "none" (PROTOCOL.key in OpenSSH)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(64 * 1024).decode("ascii", "replace")
    except OSError:
        return False
    if "Proc-Type: 4,ENCRYPTED" in text or "BEGIN ENCRYPTED PRIVATE KEY" in text:
        return True
    body = re.search(r"-----BEGIN OPENSSH PRIVATE KEY-----(.*?)-----END", text, re.S)
    if body is None:
        return False
    try:
        blob = base64.b64decode("".join(body.group(1).split()))
    except ValueError:
        return False
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return False
    length = int.from_bytes(blob[len(magic):len(magic) + 4], "big")
    cipher = blob[len(magic) + 4:len(magic) + 4 + length]
    return cipher != b"none"


def _open_agent() -> paramiko.Agent | None:
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None
    try:
        return paramiko.Agent()
    except (SSHException, OSError):
        return None


def _default_identities() -> list[tuple[str, paramiko.PKey]]:
    """OpenSSH's default key files that exist and load (encrypted ones without a passphrase are skipped)."""
    found: list[tuple[str, paramiko.PKey]] = []
    for path in _DEFAULT_IDENTITIES:
        if os.path.exists(os.path.expanduser(path)):
            try:
                found.append((path, load_private_key(path)))
            except AuthenticationError:
                continue
    return found


def connect(settings: SSHSettings, *, max_channels: int = DEFAULT_MAX_CHANNELS,
            max_output: int = DEFAULT_MAX_OUTPUT, dialled: DialledSocket | None = None) -> SSHConnection:
    """Open (connect, verify, authenticate) a connection to a node; raises TransportError subclasses.
    dialled: the node's socket from dial.dial(), if it was dialled before this module was imported."""
    return SSHConnection(settings, max_channels=max_channels, max_output=max_output, dialled=dialled).open()


__all__ = [
    "DEFAULT_MAX_CHANNELS",
    "SSHConnection",
    "connect",
    "known_hosts_name",
    "load_private_key",
    "parse_jump_host",
]
