"""An LXC container as a guest: `pct exec CTID -- env -i <clean env> argv...` over the node's connection,
and `pct snapshot`/`rollback` on the node (`base.ProxmoxGuest`).

Real `pct exec` keeps the caller's environment (`--keep-env` defaults to 1) and forces PATH to
/sbin:/bin:/usr/sbin:/usr/bin, so the command runs under `env -i` with an explicit, complete environment.
Arguments after `--` reach lxc-attach as argv; the node's shell sees the whole line quoted once (in
`base.command_line`), so nothing is quoted twice by hand.

Telling pct's own failure from the command's stderr: pct's errors are recognised only when the exit code is
non-zero, stdout is empty, and a whole stderr line is exactly one of pct's messages *for this CT id*
(`container '101' not running!`, `Configuration file 'nodes/pve1/lxc/101.conf' does not exist`, or an
lxc-attach `lxc-attach: 101: ... Failed to get init pid` line). pct prints these instead of running the
command; a command that ran would have to fail silently on stdout and print exactly such a line for this
CT id to be misread, which a real command does not do. Any line, not just the first: the node's login
shell may print warnings (locale, motd scripts) before pct runs, and lxc-attach logs more than one line.
The exit code value is not required to be 255: real pct dies with 255, lxc-attach fails with 1, and
stand-ins differ.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import ClassVar

from fleetfix.errors import GuestError
from fleetfix.guests.base import ProxmoxGuest
from fleetfix.transport.base import CommandResult, OutputSink, Transport
from fleetfix.transport.remote import TIMEOUT_MARKER, with_watchdog

CONTAINER_ENV: tuple[str, ...] = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
    "container=lxc",
)
NODE_BACKSTOP_SECONDS = 2
TIMEOUT_EXIT_CODE = 124


def pct_exec_argv(ctid: int, argv: Sequence[str], timeout: float | None = None) -> tuple[str, ...]:
    """The node-side argv. With a timeout the watchdog runs *inside* the CT, so the kill reaches the
    command's process group there even if lxc-attach puts it in a session of its own."""
    inner = with_watchdog(argv, timeout)
    return ("pct", "exec", str(ctid), "--", "env", "-i", *CONTAINER_ENV, *inner)


def container_error(result: CommandResult, ctid: int, node: str) -> GuestError | None:
    """pct's own refusal to run the command, or None when the command itself ran (see the module doc)."""
    if result.exit_code == 0 or result.timed_out or result.stdout:
        return None
    stopped = (
        re.compile(rf"container '{ctid}' not running!"),
        re.compile(rf"lxc-attach: {ctid}: .*Failed to get init pid"),
    )
    missing = re.compile(rf"Configuration file 'nodes/[^/']+/lxc/{ctid}\.conf' does not exist")
    # The login's shell did not find pct: /usr/sbin is not on a non-root login's PATH (sudo's secure_path
    # has it), or this is no PVE node.
    no_pct = re.compile(r"(?:\S+: (?:\d+: )?(?:line \d+: )?)?pct: (?:command )?not found")
    for line in result.stderr.splitlines():
        line = line.strip()
        if result.exit_code == 127 and no_pct.fullmatch(line):
            return GuestError(f"pct was not found on {node} for this login: a login that is not root needs "
                              "become (sudo), and the node must be a Proxmox VE node")
        if any(pattern.fullmatch(line) for pattern in stopped):
            return GuestError(f"CT {ctid} on {node} is stopped")
        if missing.fullmatch(line):
            return GuestError(f"CT {ctid} does not exist on {node}")
    return None


class PctTransport:
    """Runs commands in CT `ctid` through `node` (the node's connection or transport, shared, not owned)."""

    def __init__(
        self, connection: Transport, ctid: int, *, node_name: str | None = None, label: str | None = None
    ) -> None:
        self.connection = connection
        self.ctid = ctid
        self.node_name = node_name or connection.label
        self.label = label or f"{self.node_name}/{ctid}"

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        """Raises GuestError when the CT is stopped or missing; otherwise the command's own result.
        on_output sees the node's stream as is (pct's own errors included, when the CT is not running)."""
        if not argv:
            raise ValueError("empty argv")
        # The node side gets a later deadline: the watchdog inside the CT fires first and reaches the
        # command's process group there; the node's own watchdog is only the backstop.
        node_timeout = None if timeout is None else timeout + NODE_BACKSTOP_SECONDS
        node_argv = pct_exec_argv(self.ctid, argv, timeout)
        result = self.connection.execute(node_argv, stdin=stdin, timeout=node_timeout, on_output=on_output)
        error = container_error(result, self.ctid, self.node_name)
        if error is not None:
            raise error
        # The CT's watchdog killed it (its marker, and a signal-style exit: pct/lxc-attach turn the SIGKILL
        # into 137, 255 or -1): report a timeout. A command that printed the marker and exited 1..127 ran
        # to its end.
        fired = any(line.startswith(TIMEOUT_MARKER) for line in result.stderr.splitlines())
        signalled = result.exit_code < 0 or result.exit_code >= 128
        if timeout is not None and not result.timed_out and fired and signalled:
            return dataclasses.replace(result, exit_code=TIMEOUT_EXIT_CODE, timed_out=True)
        return result


class LxcGuest(ProxmoxGuest):
    kind: ClassVar[str] = "lxc"
    tool: ClassVar[str] = "pct"
    pve_type: ClassVar[str | None] = "lxc"
    shares_node_kernel: ClassVar[bool] = True

    def transport(self) -> Transport:
        return PctTransport(self.node, self.id, node_name=self.target.node.name, label=self.target.name)
