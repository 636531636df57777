"""Two scripts in one command (transport/session.py), run for real by /bin/sh on this machine: each
script's exit status and output apart, the first run as run_script runs it, the second chosen from the
first's output, limits, and transports that cannot feed a command."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fleetfix.guests.lxc import PctTransport
from fleetfix.transport.base import NodeTransport, feedable, run_script
from fleetfix.transport.fake import FakeTransport
from fleetfix.transport.local import LocalTransport
from fleetfix.transport.session import head_script, run_then


def test_each_script_keeps_its_own_exit_status_and_output_and_the_second_is_chosen_from_the_first() -> None:
    seen: list[str] = []

    def then(first_stdout: str) -> str:
        seen.append(first_stdout)
        word = first_stdout.split()[-1]
        return f"echo second saw {word}; echo second-err >&2; exit 3\n"

    first = "echo facts; echo first-err >&2; echo 42; exit 5"  # its exit ends the first alone
    result = run_then(LocalTransport(), first, then, timeout=30)
    assert result is not None and result.second is not None
    assert seen == ["facts\n42\n"]
    assert (result.first.exit_code, result.first.stdout, result.first.stderr) == (
        5, "facts\n42\n", "first-err\n")
    assert (result.second.exit_code, result.second.stdout, result.second.stderr) == (
        3, "second saw 42\n", "second-err\n")
    alone = run_script(LocalTransport(), first)
    assert (alone.exit_code, alone.stdout, alone.stderr) == (5, "facts\n42\n", "first-err\n")


def test_the_second_runs_in_the_same_command_as_the_first() -> None:
    """One process tree: the second's shell is the first's parent (the session's shell)."""
    result = run_then(LocalTransport(), "echo $PPID", lambda out: "echo $$\n", timeout=30)
    assert result is not None and result.second is not None
    assert result.first.stdout.strip() == result.second.stdout.strip()


def test_the_first_reads_its_own_text_on_stdin_as_under_run_script() -> None:
    """What the first's commands read from stdin is what they read under run_script (its own text, as
    much as its shell left of it), never the session's: a `cat` there would otherwise wait for the second."""
    first = "read line\nthis line may be read by read\necho \"[$line]\"; cat; echo done\n"
    result = run_then(LocalTransport(), first, lambda out: "echo second\n", timeout=30)
    assert result is not None and result.second is not None
    assert result.first.stdout == run_script(LocalTransport(), first).stdout
    assert result.first.stdout.endswith("done\n") and "second" not in result.first.stdout
    assert result.second.stdout == "second\n"


def test_no_second_script_when_then_returns_none() -> None:
    result = run_then(LocalTransport(), "echo only", lambda out: None, timeout=30)
    assert result is not None
    assert (result.first.exit_code, result.first.stdout, result.second) == (0, "only\n", None)


def test_an_error_in_then_is_raised_after_the_command_ended() -> None:
    def then(out: str) -> str:
        raise ValueError(f"cannot use {out.strip()}")

    started = time.monotonic()
    with pytest.raises(ValueError, match="cannot use facts"):
        run_then(LocalTransport(), "echo facts", then, timeout=30)
    assert time.monotonic() - started < 10  # stdin was closed: the session did not wait for its timeout


def test_a_first_that_times_out_is_the_sessions_timeout_and_then_is_never_called() -> None:
    called: list[str] = []

    def then(out: str) -> str:
        called.append(out)
        return "echo x\n"

    result = run_then(LocalTransport(), "echo started; sleep 30", then, timeout=1)
    assert result is not None
    assert result.first.timed_out and result.second is None and called == []
    assert result.first.stdout == "started\n"


def test_a_second_still_running_at_the_timeout_is_killed_and_says_so() -> None:
    result = run_then(LocalTransport(), "echo facts", lambda out: "echo begun; sleep 30\n", timeout=1)
    assert result is not None and result.second is not None
    assert result.first.exit_code == 0 and not result.first.timed_out
    assert result.second.timed_out and result.second.stdout == "begun\n"


def test_the_seconds_bytes_come_back_exactly() -> None:
    """A batch's frame counts bytes: output that is not UTF-8 must survive the round trip."""
    result = run_then(LocalTransport(), "true", lambda out: "printf '\\377\\000a\\n'\n", timeout=30)
    assert result is not None and result.second is not None
    assert result.second.stdout.encode(errors="surrogateescape") == b"\xff\x00a\n"


def test_a_marker_with_another_nonce_is_the_firsts_output() -> None:
    fake = "\nfleetfix-then 0123456789abcdef 0\n"
    result = run_then(LocalTransport(), f"printf '{fake}'; echo end", lambda out: "echo second\n", timeout=30)
    assert result is not None and result.second is not None
    assert result.first.stdout == fake + "end\n"
    assert result.second.stdout == "second\n"


def test_the_first_output_over_the_cap_keeps_its_ends_and_the_marker_is_still_found() -> None:
    first = "head -c 300000 /dev/zero | tr '\\0' a; echo; echo tail"
    result = run_then(LocalTransport(), first, lambda out: "echo second\n", timeout=30, max_output=1000)
    assert result is not None and result.second is not None
    assert result.first.dropped > 0 and result.first.stdout.endswith("tail\n")
    assert result.second.stdout == "second\n"


def test_a_transport_that_cannot_feed_runs_nothing() -> None:
    fake = FakeTransport()
    assert feedable(fake) is None
    assert run_then(fake, "echo facts", lambda out: "echo second\n", timeout=30) is None
    assert fake.calls == []


def test_a_containers_feedable_view_is_its_nodes_pct_exec(tmp_path: Path) -> None:
    """Through a node's shared connection that can feed, a container's command is `pct exec CTID -- ...`
    with the same environment and limits as PctTransport.execute; through one that cannot, there is none."""
    assert feedable(PctTransport(NodeTransport(FakeTransport()), 101)) is None
    node = LocalTransport(env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    pct = tmp_path / "pct"
    pct.write_text('#!/bin/sh\necho "pct $1 $2 $3" >&2\nshift 3\nexec "$@"\n')
    pct.chmod(0o755)
    container = PctTransport(NodeTransport(node), 101)
    result = run_then(container, "echo facts $container", lambda out: "echo two\n", timeout=30)
    assert result is not None and result.second is not None
    assert result.first.stdout == "facts lxc\n"  # the container's clean environment (CONTAINER_ENV)
    assert result.first.stderr == "pct exec 101 --\n"
    assert result.second.stdout == "two\n"


def test_the_first_may_not_hold_the_delimiter() -> None:
    with pytest.raises(ValueError, match="delimiter"):
        head_script("echo FLEETFIX_FIRST_abc\n", "abc")
