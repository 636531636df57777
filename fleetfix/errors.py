"""The one exception tree of fleetfix. Every class carries its exit code, and the classes a new user meets
first carry the next thing to try (`hint`): the CLI prints `message — hint`, nothing matches on wording.

    FleetfixError (1)
    ├── ConfigError (2)                 bad input: inventory, playbook, policy, CLI values
    │   ├── InventoryError
    │   │   └── InventoryNotFoundError  no inventory file where one was expected
    │   ├── PlaybookError
    │   └── TemplateError
    ├── TransportError (4)              a target could not be reached or driven
    │   ├── ConnectError                the node could not be reached (some other way)
    │   │   ├── ConnectRefusedError     nothing listens on that port
    │   │   ├── ConnectTimeoutError     TCP connect or SSH handshake timed out
    │   │   └── NameResolutionError     the host name does not resolve
    │   ├── AuthenticationError         key rejected, no usable key
    │   │   └── KeyPermissionError      private key readable by others (refused as by OpenSSH)
    │   ├── HostKeyError                host key not trusted
    │   │   ├── UnknownHostKeyError     no entry in known_hosts (use --accept-new to record it)
    │   │   └── ChangedHostKeyError     entry differs: possible man-in-the-middle, never accepted
    │   ├── BecomeError                 sudo refused a node command (not allowed, password needed)
    │   ├── GuestError                  the guest cannot run commands: CT/VM stopped, missing, no agent
    │   ├── ConnectionLostError         the link dropped mid-command
    │   ├── CommandTimeoutError         a command ran past its timeout (channel closed)
    │   └── DiscoveryError              a Proxmox source could not be listed (API/TLS/token/pvesh)
    ├── StoreError (1)                  the audit database: locked, disk full, corrupt
    ├── CommandFailedError (1)          result.check() on a non-zero exit
    ├── AuditBusyError (1)              another audit holds the history's lock
    ├── TransferError (1)               a file push/pull failed: checksum mismatch, too big, missing, refused
    ├── ProbeOutputError (4)            a target's probe printed something that is not the probe's JSON
    ├── UnexpectedError (1)             a bug surfaced while working on one target (kept per target)
    └── Interrupted (130)               the target was never started: Ctrl-C came first

Only expected failures belong here; anything else is a bug and may show a traceback with -v.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """The process exit codes, the same for every command (docs/cli.md)."""

    OK = 0  # success / healthy
    FAILED = 1  # a command or step failed
    USAGE = 2  # bad input: inventory, playbook, options
    FINDINGS = 3  # probe/audit found error-severity findings
    UNREACHABLE = 4  # a target could not be reached
    INTERRUPTED = 130  # Ctrl-C


def one_line(value: object) -> str:
    """value's text as one line of a message (whitespace runs, newlines included, become one space); an
    exception without text is named by its class, so a message never ends in nothing."""
    text = " ".join(str(value).split())
    return text or (type(value).__name__ if isinstance(value, BaseException) else "")


class FleetfixError(Exception):
    """Base of every error fleetfix raises on purpose."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED
    hint: ClassVar[str | None] = None  # what to try next, appended where the error is shown

    def with_hint(self) -> str:
        """The one-line message, ending with what to do next when the class knows it."""
        return f"{self} — {self.hint}" if self.hint else str(self)


class ConfigError(FleetfixError):
    """Bad input. The message names file, line and field when they are known."""

    exit_code: ClassVar[ExitCode] = ExitCode.USAGE

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path, self.line, self.field, self.detail = path, line, field, message
        super().__init__(self._format())

    def _format(self) -> str:
        # One line, always: a hostile key (a newline in a YAML key) must not forge lines of output.
        if self.field and not self.field.isprintable():
            self.field = repr(self.field)
        where = ""
        if self.path:
            where = self.path + (f":{self.line}" if self.line else "")
        if self.field:
            where = f"{where}: {self.field}" if where else self.field
        return f"{where}: {self.detail}" if where else self.detail


class InventoryError(ConfigError):
    pass


class InventoryNotFoundError(InventoryError):
    hint = "write one (see docs/inventory.md), or name a single node with --host ADDR"


class PlaybookError(ConfigError):
    pass


class TemplateError(ConfigError):
    pass


class TransportError(FleetfixError):
    """A target could not be reached or driven. Per target: the fleet runner records it and goes on."""

    exit_code: ClassVar[ExitCode] = ExitCode.UNREACHABLE


class ConnectError(TransportError):
    hint = "check the address and port, and that this machine can reach the node (firewall, VPN)"


class ConnectRefusedError(ConnectError):
    hint = "is sshd running there, on that port? check --port (inventory: port)"


class ConnectTimeoutError(ConnectError):
    hint = ("check the address and that this machine can reach it (firewall, VPN); on a slow link raise "
            "--connect-timeout")


class NameResolutionError(ConnectError):
    hint = "check the host name, or use the IP address"


class AuthenticationError(TransportError):
    hint = ("check --user, and that the node's ~/.ssh/authorized_keys lists your public key; pick the key "
            "with --identity FILE (inventory: identity_file) or load it with `ssh-add`")


class KeyPermissionError(AuthenticationError):
    hint = "chmod 600 the key file (OpenSSH refuses it too)"


class HostKeyError(TransportError):
    pass


class UnknownHostKeyError(HostKeyError):
    hint = ("check the fingerprint on the node's console (`ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub`); if the key is recorded in another file, pass "
            "--known-hosts FILE")


class ChangedHostKeyError(HostKeyError):
    hint = ("confirm the new fingerprint on the node's console (`ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub`) before removing the old entry")


class BecomeError(TransportError):
    """sudo refused to run a node command for the login (not allowed, a password needed, sudo missing)."""

    hint = ("grant the login this command in sudoers (docs/security.md, \"Least privilege on nodes\"); "
            "a rule that asks for a password needs become_password")


class GuestError(TransportError):
    """The guest cannot run commands (stopped, not on that node, no guest agent). Nothing ran."""


class ConnectionLostError(TransportError):
    pass


class CommandTimeoutError(TransportError):
    pass


class DiscoveryError(TransportError):
    """A Proxmox source (API or `pvesh` over SSH) could not be listed. Never carries the token secret."""


class StoreError(FleetfixError):
    """The audit database failed under us: locked past the timeout, the disk full, corruption found."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class CommandFailedError(FleetfixError):
    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class AuditBusyError(FleetfixError):
    """Another `fleetfix audit` is writing the same history (fleetfix.audit.lock). Names the database."""

    hint = ("let it finish, or stop it: a hung scheduled audit is stopped after the unit's "
            "TimeoutStartSec= (`fleetfix schedule install --timeout`)")

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class TransferError(FleetfixError):
    """A file could not be pushed or pulled as asked (missing, too big, checksum mismatch, refused by the
    node or the guest). The destination is left as it was; temp files are removed. A lost link during a
    transfer is a ConnectionLostError instead."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class ProbeOutputError(FleetfixError):
    exit_code: ClassVar[ExitCode] = ExitCode.UNREACHABLE


class UnexpectedError(FleetfixError):
    """A bug surfaced while working on one target; kept per target so the run goes on."""


class Interrupted(FleetfixError):
    """The target was never started: the run was interrupted (Ctrl-C) first."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERRUPTED
