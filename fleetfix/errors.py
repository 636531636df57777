"""The one exception tree of fleetfix. Every class carries the exit code the CLI uses for it.

    FleetfixError (1)
    ├── ConfigError (2)                 bad input: inventory, playbook, policy, CLI values
    │   ├── InventoryError
    │   ├── PlaybookError
    │   └── TemplateError
    ├── TransportError (4)              a target could not be reached or driven
    │   ├── ConnectError                refused, unreachable, DNS, connect timeout
    │   ├── AuthenticationError         key rejected, no usable key
    │   ├── HostKeyError                host key not trusted
    │   │   ├── UnknownHostKeyError     no entry in known_hosts (use --accept-new to record it)
    │   │   └── ChangedHostKeyError     entry differs: possible man-in-the-middle, never accepted
    │   ├── ContainerError              CT stopped or not on that node
    │   ├── ConnectionLostError         the link dropped mid-command
    │   ├── CommandTimeoutError         a command ran past its timeout (channel closed)
    │   └── DiscoveryError              a Proxmox source could not be listed (API/TLS/token/pvesh)
    ├── CommandFailedError (1)          result.check() on a non-zero exit
    └── ProbeOutputError (4)            a target's probe printed something that is not the probe's JSON

Only expected failures belong here; anything else is a bug and may show a traceback with -v.
"""

from __future__ import annotations

from typing import ClassVar


class FleetfixError(Exception):
    """Base of every error fleetfix raises on purpose."""

    exit_code: ClassVar[int] = 1


class ConfigError(FleetfixError):
    """Bad input. The message names file, line and field when they are known."""

    exit_code: ClassVar[int] = 2

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


class PlaybookError(ConfigError):
    pass


class TemplateError(ConfigError):
    pass


class TransportError(FleetfixError):
    """A target could not be reached or driven. Per target: the fleet runner records it and goes on."""

    exit_code: ClassVar[int] = 4


class ConnectError(TransportError):
    pass


class AuthenticationError(TransportError):
    pass


class HostKeyError(TransportError):
    pass


class UnknownHostKeyError(HostKeyError):
    pass


class ChangedHostKeyError(HostKeyError):
    pass


class ContainerError(TransportError):
    pass


class ConnectionLostError(TransportError):
    pass


class CommandTimeoutError(TransportError):
    pass


class CommandFailedError(FleetfixError):
    exit_code: ClassVar[int] = 1


class ProbeOutputError(FleetfixError):
    exit_code: ClassVar[int] = 4


class DiscoveryError(TransportError):
    """A Proxmox source (API or `pvesh` over SSH) could not be listed. Never carries the token secret."""
