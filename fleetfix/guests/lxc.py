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

Files: `pct push CTID FILE DEST [--perms P]` / `pct pull CTID PATH DEST [--perms P]` move a file between the
node and the CT (pve-container `src/PVE/CLI/pct.pm`, read at 94f5585, 2026-06-16): both need a running CT
("can only push files to a running CT" / "can only pull files from a running VM"), take the CT's config
lock, and do the copy in a forked worker that setns()s into the CT's mount namespace (and, on push to an
unprivileged CT, its user namespace, as the CT's root). Three things in that code shape what `push()` /
`pull()` here do:
- the worker's errors ("failed to open ...", "failed to create file: ...") are printed to stderr, but
  `pct` still exits 0 (pve-common's RESTEnvironment::fork_worker returns the task id in scalar context and
  CLIHandler::run_cli_handler exits 0), and File::Copy's `copy` result is not checked (a short write on a
  full disk passes silently): so success is judged only by the sha256 of what arrived, never by the exit
  status;
- `create_file` opens the destination with O_TRUNC and writes in place, and pull creates the destination
  *before* it opens the source: so both go to temp names (a failed pull leaves an empty staging file, which
  the `finally` removes) and the real destination changes only by rename;
- `--perms` is octal by default; without it a new file gets 0666 & ~umask, readable by anyone on the node
  while it is staged: so every copy here passes `--perms 0600`.
The file is first staged on the node with SFTP (`guests.transfer`), in NODE_STAGING_DIR under a random
name, created exclusively with mode 0600, and removed on every exit path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from fleetfix.errors import FleetfixError, GuestError, TransferError
from fleetfix.guests.base import ProxmoxGuest
from fleetfix.guests.transfer import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TRANSFER_TIMEOUT,
    NODE_STAGING_DIR,
    TransferResult,
    check_guest_path,
    finish_in_guest,
    guest_digest,
    node_files,
    open_local,
    receive_local,
    unique_suffix,
)
from fleetfix.transport.base import (
    TIMEOUT_EXIT_CODE,
    CommandResult,
    FeedableTransport,
    OutputSink,
    StdinFeed,
    Transport,
    feedable,
)
from fleetfix.transport.remote import TIMEOUT_MARKER, with_watchdog

CONTAINER_ENV: tuple[str, ...] = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
    "container=lxc",
)
NODE_BACKSTOP_SECONDS = 2


def pct_exec_argv(ctid: int, argv: Sequence[str], timeout: float | None = None) -> tuple[str, ...]:
    """The node-side argv."""
    return ("pct", "exec", str(ctid), "--", *container_argv(argv, timeout))


def container_argv(argv: Sequence[str], timeout: float | None = None) -> tuple[str, ...]:
    """What `pct exec CTID --` runs. With a timeout the watchdog runs *inside* the CT, so the kill reaches
    the command's process group there even if lxc-attach puts it in a session of its own."""
    return ("env", "-i", *CONTAINER_ENV, *with_watchdog(argv, timeout))


def backstop(timeout: float | None) -> float | None:
    """The node side's deadline for a command with this timeout in the CT: later, so the watchdog inside
    the CT fires first and reaches the command's process group there; the node's is only the backstop."""
    return None if timeout is None else timeout + NODE_BACKSTOP_SECONDS


def pct_result(result: CommandResult, ctid: int, node: str, timeout: float | None) -> CommandResult:
    """What `pct exec` on the node said, as the command's own result: raises GuestError when pct refused
    (the CT is stopped or missing), and reports the CT's watchdog kill as a timeout. A command that printed
    the watchdog's marker and exited 1..127 ran to its end."""
    error = container_error(result, ctid, node)
    if error is not None:
        raise error
    # The CT's watchdog killed it (its marker, and a signal-style exit: pct/lxc-attach turn the SIGKILL
    # into 137, 255 or -1).
    fired = any(line.startswith(TIMEOUT_MARKER) for line in result.stderr.splitlines())
    signalled = result.exit_code < 0 or result.exit_code >= 128
    if timeout is not None and not result.timed_out and fired and signalled:
        return dataclasses.replace(result, exit_code=TIMEOUT_EXIT_CODE, timed_out=True)
    return result


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
        node_argv = pct_exec_argv(self.ctid, argv, timeout)
        result = self.connection.execute(node_argv, stdin=stdin, timeout=backstop(timeout),
                                         on_output=on_output)
        return pct_result(result, self.ctid, self.node_name, timeout)

    def feedable(self) -> FeedableTransport | None:
        """This CT's commands with stdin fed over time, where the node's connection can feed (not through
        become: sudo rules name commands)."""
        node = feedable(self.connection)
        return None if node is None else _FedPct(self, node)


class _FedPct:
    """`PctTransport.execute`'s twin for a fed stdin: the same argv, limits and reading of pct's refusals."""

    def __init__(self, pct: PctTransport, node: FeedableTransport) -> None:
        self.pct, self.node = pct, node
        self.label = pct.label

    def execute_fed(self, argv: Sequence[str], feed: StdinFeed, *, timeout: float | None = None,
                    on_output: OutputSink | None = None) -> CommandResult:
        node_argv = pct_exec_argv(self.pct.ctid, argv, timeout)
        result = self.node.execute_fed(node_argv, feed, timeout=backstop(timeout), on_output=on_output)
        return pct_result(result, self.pct.ctid, self.pct.node_name, timeout)


# pct push / pull refusing a stopped CT (a die before the worker; pull's message has no newline, so Perl
# appends " at .../pct.pm line N.").
_NOT_RUNNING = re.compile(r"can only (push files to a running CT|pull files from a running VM)")
# argv: CTID STAGED DEST [pct options]. The staged file is removed whatever pct did.
_PUSH_AND_CLEAN = 'pct push "$@"; rc=$?; rm -f -- "$2"; exit "$rc"'


class LxcGuest(ProxmoxGuest):
    kind: ClassVar[str] = "lxc"
    tool: ClassVar[str] = "pct"
    pve_type: ClassVar[str | None] = "lxc"
    shares_node_kernel: ClassVar[bool] = True

    def transport(self) -> Transport:
        return PctTransport(self.node, self.id, node_name=self.target.node.name, label=self.target.name)

    def _refused(self, result: CommandResult) -> None:
        if _NOT_RUNNING.search(result.stderr):
            raise GuestError(f"CT {self.id} on {self.target.node.name} is stopped")
        error = container_error(result, self.id, self.target.node.name)
        if error is not None:
            raise error

    def push(self, local_path: str | Path, remote_path: str, *, mode: int = 0o644,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        dest = check_guest_path(remote_path)
        files = node_files(self.node)
        token = unique_suffix()
        staged, ct_tmp = f"{NODE_STAGING_DIR}/fleetfix-push-{token}", f"{dest}.fleetfix-{token}.tmp"
        started = time.monotonic()
        with open_local(local_path, max_bytes) as source:
            sent = files.upload(source, staged, mode=0o600, max_bytes=max_bytes)  # removes itself on failure
        try:
            pushed = self.node.execute(
                ("/bin/sh", "-c", _PUSH_AND_CLEAN, "sh", str(self.id), staged, ct_tmp, "--perms", "0600"),
                timeout=self.timeout)
        except FleetfixError:
            with contextlib.suppress(FleetfixError):
                files.remove(staged)
            raise
        self._refused(pushed)
        failure = finish_in_guest(self.transport(), ct_tmp, dest, sent.sha256, mode,
                                  timeout=DEFAULT_TRANSFER_TIMEOUT)
        if failure is not None:
            said = _last_line(pushed.stderr)
            raise TransferError(f"{self.target.name}: push {local_path} -> {dest}: {failure}"
                                + (f" (pct push: {said})" if said else ""))
        return TransferResult(str(local_path), dest, sent.size, sent.sha256, time.monotonic() - started)

    def pull(self, remote_path: str, local_path: str | Path, *, mode: int = 0o600,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        source = check_guest_path(remote_path)
        files = node_files(self.node)
        what = f"{self.target.name}: pull {source} -> {local_path}"
        started = time.monotonic()
        found = guest_digest(self.transport(), source)
        if found is None:
            raise TransferError(f"{what}: no such file")
        if found.size > max_bytes:
            raise TransferError(f"{what}: {found.size} bytes, over the limit of {max_bytes}")
        staged = f"{NODE_STAGING_DIR}/fleetfix-pull-{unique_suffix()}"
        try:
            pulled = self.node.execute(("pct", "pull", str(self.id), source, staged, "--perms", "0600"),
                                       timeout=self.timeout)
            self._refused(pulled)
            said = _last_line(pulled.stderr)
            try:
                got = receive_local(local_path, mode, found,
                                    lambda sink: files.download(staged, sink, max_bytes=max_bytes), what=what)
            except TransferError as error:
                raise TransferError(f"{error}" + (f" (pct pull: {said})" if said else "")) from None
        finally:
            # Also after a failed pull: pct creates the destination before it opens the source.
            with contextlib.suppress(FleetfixError):
                files.remove(staged)
        return TransferResult(source, str(local_path), got.size, got.sha256, time.monotonic() - started)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
