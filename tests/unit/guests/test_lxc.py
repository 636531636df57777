"""PctTransport: the node-side argv, pct's own errors, and a run through a fake `pct` on this machine."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from fleetfix.errors import GuestError
from fleetfix.guests.lxc import (
    CONTAINER_ENV,
    NODE_BACKSTOP_SECONDS,
    PctTransport,
    container_error,
    pct_exec_argv,
)
from fleetfix.transport.base import CommandResult, command_line, run_script
from fleetfix.transport.fake import ANY, FakeTransport
from fleetfix.transport.local import LocalTransport


def node_answering(answer: CommandResult) -> FakeTransport:
    """A node transport answering every command with answer, recording each call."""
    return FakeTransport("pve1").on(ANY, answer)


def result(code: int, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(code, stdout, stderr, 0.01)


def test_argv_is_pct_exec_with_a_clean_environment() -> None:
    node = node_answering(result(0, "ok"))
    PctTransport(node, 101).execute(["cat", "/etc/os-release"], stdin=b"in")
    argv, stdin, timeout = node.calls[0].argv, node.calls[0].stdin, node.calls[0].timeout
    assert argv == ("pct", "exec", "101", "--", "env", "-i", *CONTAINER_ENV, "cat", "/etc/os-release")
    assert (stdin, timeout) == (b"in", None)
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in CONTAINER_ENV


def test_with_a_timeout_the_watchdog_runs_inside_the_container_first() -> None:
    argv = pct_exec_argv(101, ["sleep", "5"], timeout=2)
    env_end = argv.index(CONTAINER_ENV[-1]) + 1
    assert argv[env_end:env_end + 2] == ("/bin/sh", "-c")
    assert argv[-3:] == ("2", "sleep", "5")
    node = node_answering(result(0))
    PctTransport(node, 101).execute(["true"], timeout=2)
    assert node.calls[0].timeout == 2 + NODE_BACKSTOP_SECONDS  # the node's deadline is only the backstop


def test_hostile_words_survive_one_round_of_quoting() -> None:
    hostile = ["a b", "$(reboot)", "`id`", "'\"\\", "x\ny", "; rm -rf /", ""]
    line = command_line(pct_exec_argv(7, hostile))
    assert shlex.split(line)[-len(hostile):] == hostile


@pytest.mark.parametrize(
    ("stderr", "message"),
    [
        ("container '101' not running!\n", "CT 101 on pve1 is stopped"),
        ("lxc-attach: 101: attach.c: get_attach_context: 405 Failed to get init pid\n"
         "lxc-attach: 101: lxc_attach.c: main: 395 Failed to attach to container\n",
         "CT 101 on pve1 is stopped"),
        ("Configuration file 'nodes/pve1/lxc/101.conf' does not exist\n", "CT 101 does not exist on pve1"),
        ("bash: warning: setlocale: LC_ALL: cannot change locale\ncontainer '101' not running!\n",
         "CT 101 on pve1 is stopped"),
    ],
)
def test_pct_errors_become_container_errors(stderr: str, message: str) -> None:
    with pytest.raises(GuestError) as caught:
        PctTransport(node_answering(result(255, "", stderr)), 101).execute(["true"])
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "answer",
    [
        result(0, "", "container '101' not running!\n"),  # the command succeeded
        result(255, "some output", "container '101' not running!\n"),  # the command ran and printed
        result(255, "", "container '102' not running!\n"),  # another CT's message
        result(1, "", "error: container '101' not running! (quoted by the command)\n"),  # not a whole line
        result(2, "", "Configuration file 'nodes/pve1/lxc/1011.conf' does not exist\n"),
    ],
)
def test_the_commands_own_stderr_is_not_mistaken_for_pct(answer: CommandResult) -> None:
    assert container_error(answer, 101, "pve1") is None
    assert PctTransport(node_answering(answer), 101).execute(["x"]) is answer


FAKE_PCT = """#!/bin/sh
# pct exec CTID -- CMD...: runs CMD here; CT 999 is stopped.
printf '%s\\n' "$*" >> "$(dirname "$0")/pct.log"
[ "$1" = exec ] && [ "$3" = -- ] || { echo "400 usage" >&2; exit 255; }
[ "$2" = 999 ] && { echo "container '999' not running!" >&2; exit 255; }
shift 3
exec "$@"
"""


@pytest.fixture
def local_node(tmp_path: Path) -> LocalTransport:
    pct = tmp_path / "pct"
    pct.write_text(FAKE_PCT)
    pct.chmod(0o755)
    return LocalTransport("pve1", env={"PATH": f"{tmp_path}:/usr/bin:/bin", "LEAKY": "secret"})


def test_runs_through_a_pct_with_a_clean_env_and_verbatim_stdin(local_node: LocalTransport) -> None:
    ct = PctTransport(local_node, 200)
    out = ct.execute(["sh", "-c", 'echo "$PATH|${LEAKY-unset}|$container|$LANG"']).stdout
    assert out == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|unset|lxc|C.UTF-8\n"
    script = "cat <<'EOF' | sha256sum\n" + "q'\"$(x)`y`\\\n" * 50_000 + "EOF\n"
    expected = hashlib.sha256(("q'\"$(x)`y`\\\n" * 50_000).encode()).hexdigest()
    assert run_script(ct, script, timeout=30).stdout.split()[0] == expected


def test_stopped_ct_through_a_pct(local_node: LocalTransport) -> None:
    with pytest.raises(GuestError, match="CT 999 on pve1 is stopped"):
        PctTransport(local_node, 999).execute(["true"])


def test_exit_code_of_the_command_comes_back(local_node: LocalTransport) -> None:
    assert PctTransport(local_node, 200).execute(["sh", "-c", "exit 42"]).exit_code == 42


def test_timeout_inside_the_container_kills_and_reports(local_node: LocalTransport) -> None:
    marker = f"300.{uuid.uuid4().int % 10**9:09d}"
    started = time.monotonic()
    outcome = PctTransport(local_node, 200).execute(["sh", "-c", f"sleep {marker}; echo never"], timeout=1)
    assert time.monotonic() - started < 4
    assert (outcome.timed_out, outcome.exit_code, outcome.stdout) == (True, 124, "")
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert found == ""


@pytest.mark.parametrize(
    ("code", "timed_out"), [(137, True), (255, True), (-1, True), (5, False), (0, False)]
)
def test_the_containers_watchdog_marker_means_a_timeout_only_with_a_kill(code: int, timed_out: bool) -> None:
    answer = result(code, "", "fleetfix: timed out after 2s: killing the command\n")
    outcome = PctTransport(node_answering(answer), 101).execute(["x"], timeout=2)
    assert outcome.timed_out is timed_out
    assert outcome.exit_code == (124 if timed_out else code)
