"""`become`: how sudo is driven on a node (transport/become.py), against a scripted stand-in of sudo.

The real sudo is exercised end to end in tests/e2e/test_least_privilege.py; here, the protocol: which argv
goes out, that the password is sent only after `sudo -n` said it needs one, and that sudo's refusals are
errors while the command's own failures are results.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleetfix.errors import BecomeError
from fleetfix.fleet import Fleet
from fleetfix.guests.lxc import PctTransport
from fleetfix.target import Become, GuestRef, NodeRef, SSHSettings, Target
from fleetfix.transport.base import CommandResult
from fleetfix.transport.become import BecomeTransport, sudo_argv
from fleetfix.transport.fake import ANY, FakeCall, FakeTransport


def fake_sudo(*, needs_password: bool = False, password: str = "pw-1234",
              allowed: Sequence[str] = ("pct", "qm", "pvesh")) -> FakeTransport:
    """A node whose sudo needs a password (`needs_password`) or not, and allows only `allowed`."""

    def sudo(call: FakeCall) -> CommandResult:
        argv, stdin = call.argv, call.stdin
        assert argv[0] == "sudo"
        command = argv[argv.index("--") + 1:]
        if command[0] not in allowed:
            return CommandResult(1, "", "sudo: a password is required\n", 0.0)
        if needs_password:
            if "-n" in argv:
                return CommandResult(1, "", "sudo: a password is required\n", 0.0)
            line, _, rest = stdin.partition(b"\n")
            if line.decode() != password:
                return CommandResult(1, "", "sudo: 1 incorrect password attempt\n", 0.0)
            stdin = rest
        return CommandResult(0, f"ran {' '.join(command)} with {stdin.decode()!r}", "", 0.0)

    return FakeTransport("pve1").on(ANY, sudo)


def sent(node: FakeTransport) -> list[tuple[tuple[str, ...], bytes]]:
    return [(call.argv, call.stdin) for call in node.calls]


def test_without_a_password_sudo_never_prompts() -> None:
    node = fake_sudo()
    result = BecomeTransport(node, Become()).execute(["pct", "status", "200"], stdin=b"script")
    assert result.stdout == "ran pct status 200 with 'script'"
    assert sent(node) == [(("sudo", "-n", "-u", "root", "--", "pct", "status", "200"), b"script")]


def test_the_password_goes_only_to_a_sudo_that_asked_for_it() -> None:
    node = fake_sudo(needs_password=True)
    transport = BecomeTransport(node, Become(), password="pw-1234")
    result = transport.execute(["pct", "exec", "200", "--", "/bin/sh", "-s"], stdin=b"echo hi\n")
    assert result.stdout == "ran pct exec 200 -- /bin/sh -s with 'echo hi\\n'"
    (first, first_stdin), (second, second_stdin) = sent(node)
    assert first[:2] == ("sudo", "-n") and first_stdin == b"echo hi\n"
    assert second[:5] == ("sudo", "-S", "-k", "-p", "") and second_stdin == b"pw-1234\necho hi\n"


def test_with_a_nopasswd_rule_the_password_is_never_sent() -> None:
    node = fake_sudo(needs_password=False)
    transport = BecomeTransport(node, Become(), password="pw-1234")
    assert transport.execute(["pct", "list"], stdin=b"").ok
    assert all(b"pw-1234" not in call.stdin for call in node.calls)
    assert len(node.calls) == 1


@pytest.mark.parametrize(("needs_password", "command", "password", "message"), [
    (False, ["apt-get", "update"], None, "pve1: sudo -u root apt-get: sudo: a password is required"),
    (True, ["pct", "list"], None, "pve1: sudo -u root pct: sudo: a password is required"),
    (True, ["pct", "list"], "wrong-pw", "pve1: sudo -u root pct: sudo: 1 incorrect password attempt"),
])
def test_sudo_refusals_are_errors_naming_the_command(needs_password: bool, command: list[str],
                                                     password: str | None, message: str) -> None:
    node = fake_sudo(needs_password=needs_password)
    with pytest.raises(BecomeError) as caught:
        BecomeTransport(node, Become(), password=password).execute(command)
    assert str(caught.value) == message
    assert "wrong-pw" not in str(caught.value)


def test_a_failing_command_is_a_result_not_a_refusal() -> None:
    failing = FakeTransport("pve1").on(ANY, CommandResult(2, "", "pct: unknown command 'frobnicate'\n", 0.0))
    assert BecomeTransport(failing, Become()).execute(["pct", "frobnicate"]).exit_code == 2


def test_guests_go_through_become_and_node_facts_do_not() -> None:
    node = fake_sudo()
    settings = SSHSettings("10.0.0.5", user="fleetfix", become=Become())
    target = Target("ct", NodeRef("pve1", settings), GuestRef.lxc(200))
    with Fleet(connect=lambda _: node) as fleet:
        guest_transport = fleet.transport(target)
        assert isinstance(guest_transport, PctTransport)
        guest_transport.execute(["true"])
        assert node.calls[-1].argv[:6] == ("sudo", "-n", "-u", "root", "--", "pct")
        assert fleet.guest(target).status() == "unknown"  # the fake prints no status line
        assert node.calls[-1].argv[5:8] == ("pct", "status", "200")
        assert not isinstance(fleet.node_transport(target), BecomeTransport)


def test_sudo_argv_shapes() -> None:
    assert sudo_argv(Become(user="ops"), ["qm", "list"]) == ("sudo", "-n", "-u", "ops", "--", "qm", "list")
    with pytest.raises(ValueError, match="unsupported"):
        sudo_argv(Become(method="su"), ["qm"])
