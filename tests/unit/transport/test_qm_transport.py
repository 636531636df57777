"""QmGuestExecTransport: the node-side argv, qm's JSON (recorded in qm's own Perl format), its failures,
stdin over qm's 1 MiB limit, cut output and timeouts. The real round trip through sshd, the `qm` stand-in
and a guest agent is in tests/e2e/test_lab_qm.py and test_cli_vm.py."""

from __future__ import annotations

import json

import pytest

from fleetfix.errors import GuestError, TransportError
from fleetfix.guests import GUEST_KINDS, open_guest, pve_types
from fleetfix.guests.vm import (
    QGA_OUTPUT_LIMIT,
    QM_BACKSTOP_SECONDS,
    QM_STDIN_LIMIT,
    VM_ENV,
    QmGuestExecTransport,
    VmGuest,
    agent_bytes,
    qm_exec_argv,
)
from fleetfix.target import GuestRef, NodeRef, Target
from fleetfix.transport.base import CommandResult, run_script
from fleetfix.transport.fake import ANY, FakeTransport
from fleetfix.transport.remote import TIMEOUT_MARKER


def recording_node(*answers: CommandResult) -> FakeTransport:
    """A node transport that records every call and answers them in order, one answer each."""
    node = FakeTransport("pve1")
    for answer in answers:
        node.on(ANY, answer, times=1)
    return node


def perl_json(status: dict[str, object]) -> str:
    """What qm prints: to_json(pretty, canonical, utf8) - keys sorted, 3-space indent, `" : "`."""
    body = ",\n".join(f"   {json.dumps(key)} : {json.dumps(value, ensure_ascii=False)}"
                      for key, value in sorted(status.items()))
    return "{\n" + body + "\n}\n"


def qm_ok(status: dict[str, object], stderr: str = "") -> CommandResult:
    return CommandResult(0, perl_json(status), stderr, 0.2)


def died(message: str, code: int = 255) -> CommandResult:
    return CommandResult(code, "", message + "\n", 0.1)


def test_argv_is_qm_guest_exec_with_a_clean_environment_and_stdin_passed() -> None:
    node = recording_node(qm_ok({"exited": 1, "exitcode": 0, "out-data": "ok\n"}))
    result = QmGuestExecTransport(node, 300).execute(["cat", "/etc/os-release"], stdin=b"in")
    argv, stdin, timeout = node.calls[0].argv, node.calls[0].stdin, node.calls[0].timeout
    assert argv == ("qm", "guest", "exec", "300", "--timeout", "0", "--pass-stdin", "1", "--",
                    "env", "-i", *VM_ENV, "cat", "/etc/os-release")
    assert (stdin, timeout) == (b"in", None)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "ok\n", "")


def test_without_stdin_qm_is_not_asked_to_read_any() -> None:
    # An empty --pass-stdin would still hand the agent an (empty) input-data; without it stdin is /dev/null.
    argv = qm_exec_argv(300, ["true"], timeout=None, pass_stdin=False)
    assert "--pass-stdin" not in argv and argv[:6] == ("qm", "guest", "exec", "300", "--timeout", "0")


def test_with_a_timeout_the_watchdog_runs_in_the_vm_in_its_own_session() -> None:
    argv = qm_exec_argv(300, ["sleep", "5"], timeout=2, pass_stdin=False)
    assert argv[4:6] == ("--timeout", str(2 + QM_BACKSTOP_SECONDS))  # qm waits longer than the watchdog
    inner = argv[argv.index("--") + 1:]
    after_env = inner[inner.index(VM_ENV[-1]) + 1:]
    # setsid first: the watchdog's `kill -KILL 0` must reach the command's group, never the agent's.
    assert after_env[:3] == ("setsid", "/bin/sh", "-c")
    assert after_env[-3:] == ("2", "sleep", "5")


def test_exit_code_and_both_streams_come_from_the_json() -> None:
    node = recording_node(qm_ok({"exited": 1, "exitcode": 3, "out-data": "out\n", "out-truncated": 0,
                                "err-data": "err\n", "err-truncated": 0}))
    chunks: list[tuple[str, bytes]] = []
    result = QmGuestExecTransport(node, 300).execute(["x"], on_output=lambda s, c: chunks.append((s, c)))
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    assert chunks == [("stdout", b"out\n"), ("stderr", b"err\n")]  # once, at the end: no live stream


def test_bytes_come_back_whole_through_qms_double_encoding() -> None:
    # qm prints the agent's bytes as characters U+0000..U+00FF (a Perl byte string through a UTF-8 JSON
    # encoder): "é" (C3 A9) arrives as "Ã©".
    raw = "é\n".encode()
    node = recording_node(qm_ok({"exited": 1, "exitcode": 0, "out-data": raw.decode("latin-1")}))
    assert QmGuestExecTransport(node, 300).execute(["x"]).stdout == "é\n"
    assert agent_bytes("\u00c3\u00a9") == "é".encode()
    assert agent_bytes("€") == "€".encode() and agent_bytes(None) == b""


def test_a_command_killed_by_a_signal_is_128_plus_it() -> None:
    node = recording_node(qm_ok({"exited": 1, "signal": 15}))
    assert QmGuestExecTransport(node, 300).execute(["x"]).exit_code == 143


@pytest.mark.parametrize(
    ("stderr", "timeout", "timed_out", "code"),
    [
        (f"{TIMEOUT_MARKER} 2s: killing the command\n", 2.0, True, 124),
        (f"{TIMEOUT_MARKER} 2s: killing the command\n", None, False, 137),  # no watchdog of ours ran
        ("Killed\n", 2.0, False, 137),  # killed by something else (OOM): the command's own fate
    ],
)
def test_the_vms_watchdog_marker_with_a_kill_is_a_timeout(
    stderr: str, timeout: float | None, timed_out: bool, code: int,
) -> None:
    node = recording_node(qm_ok({"exited": 1, "signal": 9, "err-data": stderr}))
    result = QmGuestExecTransport(node, 300).execute(["x"], timeout=timeout)
    assert (result.timed_out, result.exit_code) == (timed_out, code)


def test_qm_stopping_to_wait_is_a_timeout_naming_the_pid() -> None:
    node = recording_node(qm_ok({"pid": 4242}, stderr="timeout reached, returning pid\n"))
    result = QmGuestExecTransport(node, 300).execute(["x"], timeout=1)
    assert (result.timed_out, result.exit_code) == (True, 124)
    assert "pid 4242" in result.stderr


def test_the_nodes_watchdog_ending_qm_is_a_timeout() -> None:
    node = recording_node(CommandResult(124, "", "", 30.0, timed_out=True))
    transport = QmGuestExecTransport(node, 300)
    assert transport.execute(["x"], timeout=1).timed_out
    assert node.calls[0].timeout is not None and node.calls[0].timeout > 1 + QM_BACKSTOP_SECONDS


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (died("No QEMU guest agent configured"), "VM 300 on pve1 has no QEMU guest agent configured"),
        (died("VM 300 is not running"), "VM 300 on pve1 is stopped"),
        (died("QEMU guest agent is not running"), "VM 300 on pve1: the QEMU guest agent is not running"),
        (died("QEMU guest agent is not running"), "or it stopped answering while the command ran"),
        (died("Agent error: Invalid parameter 'pid'"),
         "VM 300 on pve1: the QEMU guest agent restarted while the command ran"),
        (died("VM 300 qmp command 'guest-exec-status' failed - got timeout"),
         "VM 300 on pve1: the QEMU guest agent did not answer guest-exec-status within qm's 5 s"),
        (died("Configuration file 'nodes/pve1/qemu-server/300.conf' does not exist"),
         "VM 300 does not exist on pve1"),
        (died("bash: warning: setlocale: LC_ALL: cannot change locale\nVM 300 is not running"),
         "VM 300 on pve1 is stopped"),
        (died("sh: 1: qm: not found", 127), "pve1: qm not found (is this a Proxmox VE node?)"),
        (died("Agent error: Guest agent command failed, error was 'Failed to execute child process "
              "\u201cenv\u201d (No such file or directory)'"),
         "VM 300 on pve1: qm guest exec failed: Agent error: Guest agent command failed"),
        (CommandResult(0, "Use of uninitialized value", "", 0.1), "qm guest exec printed no JSON result"),
    ],
)
def test_qms_own_failures_are_guest_errors(answer: CommandResult, message: str) -> None:
    with pytest.raises(GuestError) as raised:
        QmGuestExecTransport(recording_node(answer), 300).execute(["true"])
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_each_agent_failure_carries_its_own_fix() -> None:
    """No agent configured: enable it on the node and start the VM afresh (the virtio-serial port is added at
    start), then install the agent inside. Configured but silent: install/start it inside, or enable it and
    restart where the config says `agent: 0` or was changed while the VM ran."""
    def error(stderr: str) -> str:
        with pytest.raises(GuestError) as raised:
            QmGuestExecTransport(recording_node(died(stderr)), 300).execute(["true"])
        return str(raised.value)

    unconfigured = error("No QEMU guest agent configured")
    enable = "on the node, qm set 300 --agent enabled=1, then a fresh start of the VM (qm reboot 300)"
    assert enable in unconfigured
    assert unconfigured.index("qm reboot 300") < unconfigured.index("apt-get install qemu-guest-agent")
    silent = error("QEMU guest agent is not running")
    assert silent.index("in the VM, install the agent") < silent.index("systemctl start qemu-guest-agent")
    assert "if qm config 300 shows agent: 0" in silent
    assert silent.index("qm reboot 300 first") < silent.index("or it stopped answering while the command ran")


def test_another_vms_message_is_not_this_vms() -> None:
    with pytest.raises(GuestError) as raised:
        QmGuestExecTransport(recording_node(died("VM 301 is not running")), 300).execute(["true"])
    assert "is stopped" not in str(raised.value)


@pytest.mark.parametrize(
    "status",
    [
        {"exited": 1, "exitcode": 0, "out-data": "x" * 100, "out-truncated": 1},  # QEMU >= 10.1
        {"exited": 1, "exitcode": 0, "out-data": "x" * QGA_OUTPUT_LIMIT, "out-truncated": 0},  # older qga
        {"exited": 1, "exitcode": 0, "err-data": "x" * QGA_OUTPUT_LIMIT},
    ],
)
def test_output_the_agent_cut_is_an_error_not_short_facts(status: dict[str, object]) -> None:
    node = recording_node(qm_ok(status))
    with pytest.raises(TransportError, match=r"QEMU guest agent cut the command's std(out|err) at 16 MiB"):
        QmGuestExecTransport(node, 300).execute(["x"])


def test_stdin_up_to_the_limit_goes_in_one_call() -> None:
    node = recording_node(qm_ok({"exited": 1, "exitcode": 0}))
    QmGuestExecTransport(node, 300).execute(["/bin/sh", "-s"], stdin=b"x" * QM_STDIN_LIMIT)
    assert len(node.calls) == 1 and len(node.calls[0].stdin) == QM_STDIN_LIMIT


def test_stdin_over_the_limit_is_staged_in_the_vm_piece_by_piece() -> None:
    data = bytes(range(256)) * (QM_STDIN_LIMIT // 256) * 2 + b"tail"  # 2 MiB + 4 bytes: three pieces
    path = "/tmp/fleetfix-stdin.AbC123xy"
    node = recording_node(qm_ok({"exited": 1, "exitcode": 0, "out-data": path}),
                         qm_ok({"exited": 1, "exitcode": 0}),
                         qm_ok({"exited": 1, "exitcode": 0}),
                         qm_ok({"exited": 1, "exitcode": 7, "out-data": "ran\n"}))
    result = QmGuestExecTransport(node, 300).execute(["sha256sum"], stdin=data, timeout=60)
    assert (result.exit_code, result.stdout) == (7, "ran\n")
    pieces = [call.stdin for call in node.calls[:3]]
    assert b"".join(pieces) == data and all(len(piece) <= QM_STDIN_LIMIT for piece in pieces)
    final, final_stdin = node.calls[3].argv, node.calls[3].stdin
    assert final_stdin == b"" and "--pass-stdin" not in final
    # The command reads the staged file as its stdin, which is unlinked before the command runs.
    assert final[-3:] == ("sh", path, "sha256sum") and 'exec <"$1" && rm -f "$1"' in final[-4]


def test_a_failed_staging_is_an_error_and_runs_nothing() -> None:
    node = recording_node(qm_ok({"exited": 1, "exitcode": 1,
                                 "err-data": "mktemp: No space left on device\n"}))
    with pytest.raises(TransportError, match="staging stdin in the VM failed: mktemp: No space left"):
        QmGuestExecTransport(node, 300).execute(["x"], stdin=b"x" * (QM_STDIN_LIMIT + 1))
    assert len(node.calls) == 1


def test_run_script_sends_the_script_on_stdin_to_sh() -> None:
    node = recording_node(qm_ok({"exited": 1, "exitcode": 0, "out-data": "{}"}))
    run_script(QmGuestExecTransport(node, 300), "echo '{}'\n", timeout=120)
    argv, stdin = node.calls[0].argv, node.calls[0].stdin
    assert argv[-2:] == ("/bin/sh", "-s") and stdin == b"echo '{}'\n"


def test_the_vm_kind_is_registered_and_proxmox_calls_it_qemu() -> None:
    assert GUEST_KINDS["vm"] is VmGuest
    assert pve_types() == {"lxc": "lxc", "qemu": "vm"}
    target = Target("gpu-vm", NodeRef("pve1", None), GuestRef.vm(300))
    guest = open_guest(target, recording_node())
    assert isinstance(guest, VmGuest) and guest.tool == "qm" and not guest.shares_node_kernel
    transport = guest.transport()
    assert isinstance(transport, QmGuestExecTransport) and transport.label == "gpu-vm"


def test_vm_snapshots_and_status_are_qm_commands_on_the_node() -> None:
    node = recording_node(CommandResult(0, "status: running\n", "", 0.1), CommandResult(0, "", "", 0.1),
                         CommandResult(0, "", "", 0.1))
    guest = VmGuest(Target("gpu-vm", NodeRef("pve1", None), GuestRef.vm(300)), node)
    assert guest.status() == "running"
    guest.snapshot("fleetfix-20261203-030000", "before cuda-toolkit")
    guest.rollback("fleetfix-20261203-030000", start=True)
    assert [call.argv for call in node.calls] == [
        ("qm", "status", "300"),
        ("qm", "snapshot", "300", "fleetfix-20261203-030000", "--description", "before cuda-toolkit"),
        ("qm", "rollback", "300", "fleetfix-20261203-030000", "--start", "1"),
    ]
