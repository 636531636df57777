"""A Proxmox VM as a guest: commands through the QEMU guest agent with `qm guest exec` on the node, and
`qm snapshot`/`rollback` on the node (`base.ProxmoxGuest`).

What `qm guest exec` does (qemu-server `src/PVE/CLI/qm.pm` `exec`, `PVE/QemuServer/Agent.pm`; QEMU
`qga/commands.c`; docs/findings.md "Proxmox VMs (qm)" has each fact with its source):

- `qm guest exec VMID [--pass-stdin 1] [--timeout N] -- CMD ARGS...` asks the agent inside the VM to spawn
  CMD (an argv, no shell), then polls the agent's `guest-exec-status` about once a second until CMD has
  exited or N seconds have passed (default 30; 0: no limit). It prints one JSON object on stdout and exits
  0 whatever CMD's exit code: `exited` (1/0), `exitcode` or `signal`, `out-data`/`err-data` (the whole
  output, only at the end) and `out-truncated`/`err-truncated`. When N runs out it warns `timeout reached,
  returning pid` and prints only `{"pid": P}`: CMD goes on running in the VM.
- `--pass-stdin 1` reads qm's stdin to EOF and hands it to the agent as `input-data`, at most 1 MiB
  (`'input-data' (STDIN) is limited to 1 MiB, aborting`). Without it CMD's stdin is /dev/null.
- qm's own failures are a Perl `die`: one line on stderr, a non-zero exit, no JSON. `No QEMU guest agent
  configured` (no `agent:` line in the VM's config), `VM VMID is not running`, `QEMU guest agent is not
  running` (no answer to guest-ping within 3 s), `Configuration file 'nodes/NODE/qemu-server/VMID.conf'
  does not exist`, `Agent error: ...`.
- The agent (qemu-ga, as root) spawns CMD with the agent's own environment (not the caller's) and in the
  agent's process group: a `kill 0` in CMD would kill qemu-ga itself. It keeps at most 16 MiB of each
  stream and drops the rest (the truncated flag). It has no command to kill what it spawned.

So: scripts go on stdin to `/bin/sh -s` (the probe is ~35 KB); stdin over 1 MiB is first staged into a
temporary file in the VM, 1 MiB per call, then redirected into the command. The environment is given
explicitly (`env -i`), as in containers. With a timeout, transport/remote.py's watchdog runs inside the VM
in a session of its own (`setsid`), so its `kill -KILL 0` ends the command's process group and never the
agent; qm's own limit and the node's are later backstops. Output arrives in one piece at the end (the agent
cannot stream), and cut output is an error, never quietly short facts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from fleetfix.errors import FleetfixError, GuestError, TransferError, TransportError
from fleetfix.guests.base import ProxmoxGuest
from fleetfix.guests.transfer import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TRANSFER_TIMEOUT,
    TransferResult,
    check_guest_path,
    finish_in_guest,
    guest_digest,
    open_local,
    receive_local,
    unique_suffix,
)
from fleetfix.transport.base import (
    TIMEOUT_EXIT_CODE,
    CommandResult,
    OutputSink,
    Transferred,
    Transport,
    replay_output,
)
from fleetfix.transport.remote import TIMEOUT_MARKER, watchdog_seconds, with_watchdog

# qm.pm `exec`: "'input-data' (STDIN) is limited to 1 MiB" (more than 1024 * 1024 bytes dies).
QM_STDIN_LIMIT = 1024 * 1024
# qga/commands.c GUEST_EXEC_MAX_OUTPUT: what the agent keeps of each stream.
QGA_OUTPUT_LIMIT = 16 * 1024 * 1024
VM_ENV: tuple[str, ...] = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
)
# qm stops waiting this long after the VM's watchdog should have killed the command (qm polls once a
# second); the node's SSH-side watchdog waits longer still (qm also reads stdin, loads the config and pings
# the agent, up to 3 s, before it starts the command).
QM_BACKSTOP_SECONDS = 5
NODE_BACKSTOP_SECONDS = 15
# The staged stdin: created by mktemp in the VM, redirected into the command and unlinked before it runs.
_STAGE_FIRST = 'umask 077 && f=$(mktemp /tmp/fleetfix-stdin.XXXXXXXX) && cat > "$f" && printf %s "$f"'
_STAGE_MORE = 'cat >> "$1"'
_FROM_STAGED = 'exec <"$1" && rm -f "$1" && shift && exec "$@"'
_STAGED_PATH = re.compile(r"/tmp/fleetfix-stdin\.[A-Za-z0-9]+")


def vm_command(argv: Sequence[str], timeout: float | None) -> tuple[str, ...]:
    """What the agent spawns: argv under a clean environment and, with a timeout, under the watchdog in a
    new session. The agent's child is never a process-group leader (g_spawn only forks), so `setsid` calls
    setsid(2) and execs in place, and the exit status is the command's."""
    inner: tuple[str, ...] = tuple(argv)
    if timeout is not None:
        inner = ("setsid", *with_watchdog(argv, timeout))
    return ("env", "-i", *VM_ENV, *inner)


def qm_exec_argv(vmid: int, argv: Sequence[str], *, timeout: float | None, pass_stdin: bool
                 ) -> tuple[str, ...]:
    """The node-side argv. qm's own wait is always given: its default (30 s) would return early."""
    qm_timeout = 0 if timeout is None else watchdog_seconds(timeout) + QM_BACKSTOP_SECONDS
    stdin = ("--pass-stdin", "1") if pass_stdin else ()
    return ("qm", "guest", "exec", str(vmid), "--timeout", str(qm_timeout), *stdin, "--",
            *vm_command(argv, timeout))


def agent_bytes(value: object) -> bytes:
    """An `out-data`/`err-data` value as the command's bytes.

    qm decodes the agent's base64 into a Perl byte string and prints it with a UTF-8 JSON encoder, so each
    byte arrives as the character with that number (U+0000..U+00FF): latin-1 gives the bytes back. A value
    with higher characters was decoded as text by some other qm version: taken as UTF-8 text then."""
    if not isinstance(value, str):
        return b""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


# The fixes for a VM the agent cannot reach (docs/findings.md, "Fixes by guest kind", has the sources). PVE
# adds the agent's virtio-serial port only when QEMU starts ("A fresh start of the VM is necessary", pve-docs
# qm.adoc "Enable Guest Agent Communication"); `qm reboot` shuts the VM down and starts it again (a reboot
# from inside keeps the same QEMU process). Debian's qemu-guest-agent service is bound to that port and is
# started by the package's udev rule when the port appears (its [Install] section is empty, so `systemctl
# enable` does nothing): installed while the port is there, `systemctl start` starts it now.
_INSTALL_AGENT = ("in the VM, install the agent (package qemu-guest-agent; Debian/Ubuntu: apt-get install "
                  "qemu-guest-agent) and start it (systemctl start qemu-guest-agent)")


def agent_not_configured_fix(vmid: int) -> str:
    """No `agent:` line in the VM's config: enable it, restart the VM so the port exists, install qemu-ga."""
    return (f"on the node, qm set {vmid} --agent enabled=1, then a fresh start of the VM (qm reboot {vmid}) "
            f"to add the agent's virtio-serial port; {_INSTALL_AGENT}")


def agent_not_running_fix(vmid: int) -> str:
    """The config names an agent but it does not answer: not installed or not started in the VM, or the config
    says `agent: 0` or was changed after the VM started (then the port is missing)."""
    return (f"{_INSTALL_AGENT}; if qm config {vmid} shows agent: 0, or the agent was enabled after the VM "
            f"started, qm set {vmid} --agent enabled=1 and qm reboot {vmid} first")


def qm_error(result: CommandResult, vmid: int, node: str) -> GuestError:
    """Why qm did not run the command (it printed no JSON), as one line for this target."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    known = {
        "No QEMU guest agent configured": f"VM {vmid} on {node} has no QEMU guest agent configured: "
        f"{agent_not_configured_fix(vmid)}",
        f"VM {vmid} is not running": f"VM {vmid} on {node} is stopped",
        # qm pings the agent before every agent command, the status polls included: a VM that reboots, or
        # an agent that restarts, while the command runs ends qm with this same line (test bed, real
        # qemu-ga: docs/testbed.md "Real guests").
        "QEMU guest agent is not running": f"VM {vmid} on {node}: the QEMU guest agent is not running: "
        f"{agent_not_running_fix(vmid)}; or it stopped answering while the command ran (the VM rebooted or "
        "the agent restarted: the command's result is lost)",
        # A restarted agent has an empty table of spawned commands: guest-exec-status of the old pid fails
        # (qga/commands.c guest_exec_info_find: "Invalid parameter 'pid'").
        "Agent error: Invalid parameter 'pid'": f"VM {vmid} on {node}: the QEMU guest agent restarted "
        "while the command ran (the VM rebooted, or qemu-ga was restarted) and no longer knows it: its "
        "result is lost, and it may still be running",
    }
    missing = re.compile(rf"Configuration file 'nodes/[^/']+/qemu-server/{vmid}\.conf' does not exist")
    # PVE's mon_cmd: "VM 300 qmp command 'guest-exec-status' failed - got timeout" (5 s per agent command).
    agent_timeout = re.compile(rf"VM {vmid} qmp command '(guest-[a-z-]+)' failed - got timeout")
    for line in reversed(lines):  # qm's die is its last line; the login shell may have warned before it
        if line in known:
            return GuestError(known[line])
        if missing.fullmatch(line):
            return GuestError(f"VM {vmid} does not exist on {node}")
        timed_out = agent_timeout.fullmatch(line)
        if timed_out:
            command = timed_out.group(1)
            return GuestError(f"VM {vmid} on {node}: the QEMU guest agent did not answer {command} within "
                              "qm's 5 s (a VM too busy, or an answer too large to pass in time); the "
                              "command's result is lost")
    if result.exit_code == 127:
        return GuestError(f"{node}: qm not found (is this a Proxmox VE node?)")
    last = lines[-1] if lines else f"exit {result.exit_code}, no output"
    return GuestError(f"VM {vmid} on {node}: qm guest exec failed: {last[:300]}")


def exec_result(status: Mapping[str, Any], *, duration: float, timeout: float | None, where: str
                ) -> CommandResult:
    """qm's JSON as a CommandResult. Raises TransportError when the agent cut the output."""
    if not status.get("exited"):  # qm's own wait ran out: it printed the pid only
        pid = status.get("pid")
        why = (f"fleetfix: qm guest exec stopped waiting; the command (pid {pid} in the VM) had not "
               "exited\n")
        return CommandResult(TIMEOUT_EXIT_CODE, "", why, duration, timed_out=True)
    out, err = agent_bytes(status.get("out-data")), agent_bytes(status.get("err-data"))
    for key, stream, data in (("out-truncated", "stdout", out), ("err-truncated", "stderr", err)):
        # Older agents report a cut stream with the flag present but false (fixed in QEMU 10.1, 2025): a
        # stream at the agent's limit counts as cut whatever the flag says.
        if status.get(key) or len(data) >= QGA_OUTPUT_LIMIT:
            raise TransportError(f"{where}: the QEMU guest agent cut the command's {stream} at "
                                 f"{QGA_OUTPUT_LIMIT // (1024 * 1024)} MiB; its output is incomplete")
    stdout, stderr = out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
    signal = status.get("signal")
    if isinstance(signal, int) and not isinstance(signal, bool):
        # The VM's watchdog kills with SIGKILL after its marker line; any other death is the command's.
        fired = any(line.startswith(TIMEOUT_MARKER) for line in stderr.splitlines())
        if timeout is not None and fired:
            return CommandResult(TIMEOUT_EXIT_CODE, stdout, stderr, duration, timed_out=True)
        return CommandResult(128 + signal, stdout, stderr, duration)
    code = status.get("exitcode")
    if isinstance(code, bool) or not isinstance(code, int):
        raise TransportError(f"{where}: qm guest exec reported neither an exit code nor a signal")
    return CommandResult(code, stdout, stderr, duration)


class QmGuestExecTransport:
    """Runs commands in VM `vmid` through `node` (the node's connection or transport, shared, not owned)."""

    def __init__(
        self, connection: Transport, vmid: int, *, node_name: str | None = None, label: str | None = None
    ) -> None:
        self.connection = connection
        self.vmid = vmid
        self.node_name = node_name or connection.label
        self.label = label or f"{self.node_name}/{vmid}"

    def execute(
        self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        """Raises GuestError when qm could not run the command (VM stopped or missing, no agent) and
        TransportError when the agent cut its output; otherwise the command's own result. on_output sees
        the output once, when the command has ended."""
        if not argv:
            raise ValueError("empty argv")
        started = time.monotonic()
        command: tuple[str, ...] = tuple(argv)
        if len(stdin) > QM_STDIN_LIMIT:
            command = ("/bin/sh", "-c", _FROM_STAGED, "sh", self._stage(stdin, timeout), *command)
            stdin = b""
        result = self._qm(command, stdin, timeout)
        result = CommandResult(result.exit_code, result.stdout, result.stderr, time.monotonic() - started,
                               result.timed_out)
        return replay_output(result, on_output)  # qm answers once, at the end

    def _qm(self, command: Sequence[str], stdin: bytes, timeout: float | None) -> CommandResult:
        argv = qm_exec_argv(self.vmid, command, timeout=timeout, pass_stdin=bool(stdin))
        node_timeout = None if timeout is None else (
            watchdog_seconds(timeout) + QM_BACKSTOP_SECONDS + NODE_BACKSTOP_SECONDS)
        result = self.connection.execute(argv, stdin=stdin, timeout=node_timeout)
        if result.timed_out:  # the node's watchdog ended qm itself
            why = "fleetfix: qm guest exec did not return in time\n"
            return CommandResult(TIMEOUT_EXIT_CODE, "", why + result.stderr, result.duration, timed_out=True)
        if result.dropped:  # qm's answer (the whole output, as JSON) was over the controller's output cap
            why = (f"fleetfix: qm guest exec answered with more than the output cap (--max-output; "
                   f"{result.dropped} bytes dropped), so the command's result and output are unknown\n")
            return CommandResult(1, "", why, result.duration, dropped=result.dropped)
        try:
            status = json.loads(result.stdout) if result.exit_code == 0 else None
        except ValueError:
            status = None
        if not isinstance(status, dict):
            if result.exit_code == 0:
                raise GuestError(f"VM {self.vmid} on {self.node_name}: qm guest exec printed no JSON result")
            raise qm_error(result, self.vmid, self.node_name)
        where = f"VM {self.vmid} on {self.node_name}"
        return exec_result(status, duration=result.duration, timeout=timeout, where=where)

    def _stage(self, data: bytes, timeout: float | None) -> str:
        """Write data to a new file in the VM, at most QM_STDIN_LIMIT bytes per qm call; its path."""
        pieces = [data[at:at + QM_STDIN_LIMIT] for at in range(0, len(data), QM_STDIN_LIMIT)]
        made = self._qm(("/bin/sh", "-c", _STAGE_FIRST), pieces[0], timeout)
        path = made.stdout
        if not made.ok or not _STAGED_PATH.fullmatch(path):
            raise TransportError(f"VM {self.vmid} on {self.node_name}: staging stdin in the VM failed: "
                                 f"{(made.stderr.strip().splitlines() or [f'exit {made.exit_code}'])[-1]}")
        for piece in pieces[1:]:
            more = self._qm(("/bin/sh", "-c", _STAGE_MORE, "sh", path), piece, timeout)
            if not more.ok:
                self._qm(("rm", "-f", path), b"", timeout)
                raise TransportError(f"VM {self.vmid} on {self.node_name}: staging stdin in the VM failed "
                                     f"(exit {more.exit_code})")
        return path


class VmGuest(ProxmoxGuest):
    kind: ClassVar[str] = "vm"
    tool: ClassVar[str] = "qm"
    pve_type: ClassVar[str | None] = "qemu"
    shares_node_kernel: ClassVar[bool] = False

    def transport(self) -> Transport:
        return QmGuestExecTransport(self.node, self.id, node_name=self.target.node.name,
                                    label=self.target.name)

    # Files go through the agent too: `qm guest` has no file-write/file-read on the CLI (only the API,
    # 60 KiB per write), so a push is the file in pieces of at most QM_STDIN_LIMIT on stdin, appended to a
    # temp file; a pull is the file read back in pieces, base64 so the bytes survive the agent's JSON, each
    # piece's encoding well under the output caps. Both end with transfer.py's checksums.

    def push(self, local_path: str | Path, remote_path: str, *, mode: int = 0o644,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        dest = check_guest_path(remote_path)
        tmp = f"{dest}.fleetfix-{unique_suffix()}.tmp"
        inside, started, digest, size = self.transport(), time.monotonic(), hashlib.sha256(), 0
        try:
            with open_local(local_path, max_bytes) as source:
                first = True
                while (piece := source.read(QM_STDIN_LIMIT)) or first:  # an empty file is created too
                    written = inside.execute(("/bin/sh", "-c", _CREATE if first else _APPEND, "sh", tmp),
                                             stdin=piece, timeout=DEFAULT_TRANSFER_TIMEOUT)
                    if not written.ok:
                        raise TransferError(f"{self.target.name}: push {local_path} -> {dest}: writing {tmp} "
                                            f"failed: {_last(written)}")
                    digest.update(piece)
                    size += len(piece)
                    first = False
        except BaseException:
            with contextlib.suppress(FleetfixError):
                inside.execute(("rm", "-f", "--", tmp), timeout=DEFAULT_TRANSFER_TIMEOUT)
            raise
        failure = finish_in_guest(inside, tmp, dest, digest.hexdigest(), mode)
        if failure is not None:
            raise TransferError(f"{self.target.name}: push {local_path} -> {dest}: {failure}")
        return TransferResult(str(local_path), dest, size, digest.hexdigest(), time.monotonic() - started)

    def pull(self, remote_path: str, local_path: str | Path, *, mode: int = 0o600,
             max_bytes: int = DEFAULT_MAX_BYTES) -> TransferResult:
        source = check_guest_path(remote_path)
        what = f"{self.target.name}: pull {source} -> {local_path}"
        inside, started = self.transport(), time.monotonic()
        found = guest_digest(inside, source)
        if found is None:
            raise TransferError(f"{what}: no such file")
        if found.size > max_bytes:
            raise TransferError(f"{what}: {found.size} bytes, over the limit of {max_bytes}")

        def receive(sink: BinaryIO) -> Transferred:
            digest, size = hashlib.sha256(), 0
            for index in range((found.size + _PULL_PIECE - 1) // _PULL_PIECE):
                read = inside.execute(("/bin/sh", "-c", _READ_PIECE, "sh", source, str(_PULL_PIECE),
                                       str(index)), timeout=DEFAULT_TRANSFER_TIMEOUT)
                if not read.ok:
                    raise TransferError(f"{what}: reading piece {index} failed: {_last(read)}")
                try:
                    piece = base64.b64decode(read.stdout, validate=False)
                except ValueError:
                    raise TransferError(f"{what}: piece {index} did not come back as base64") from None
                digest.update(piece)
                size += len(piece)
                sink.write(piece)
            return Transferred(size, digest.hexdigest())

        got = receive_local(local_path, mode, found, receive, what=what)
        return TransferResult(source, str(local_path), got.size, got.sha256, time.monotonic() - started)


# argv: TMP. The first piece creates the temp file privately; the others append.
_CREATE = 'umask 077 && cat > "$1"'
_APPEND = 'cat >> "$1"'
# argv: FILE PIECE_BYTES INDEX. One piece of the file, base64: 4 MiB come back as ~5.5 MiB of qm's JSON,
# under the agent's 16 MiB cap and the controller's default --max-output of 8 MiB per stream.
_PULL_PIECE = 4 * 1024 * 1024
_READ_PIECE = 'dd if="$1" bs="$2" skip="$3" count=1 status=none | base64'


def _last(result: CommandResult) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else ("timed out" if result.timed_out else f"exit {result.exit_code}")
