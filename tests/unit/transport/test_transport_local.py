"""LocalTransport: the same result semantics as SSH, on this machine."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import uuid

import pytest

from fleetfix.transport.base import StdinFeed, Transport, run_script
from fleetfix.transport.local import LocalTransport


def alive(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.split()


def unique_sleep() -> str:
    """A sleep duration nobody else uses, so pgrep -f finds exactly our processes."""
    return f"300.{uuid.uuid4().int % 10**9:09d}"


def test_is_a_transport() -> None:
    assert isinstance(LocalTransport(), Transport)


@pytest.mark.parametrize("code", [0, 1, 3, 100, 255])
def test_exit_code_comes_back(code: int) -> None:
    result = LocalTransport().execute(["sh", "-c", f"exit {code}"])
    assert result.exit_code == code
    assert result.ok is (code == 0)
    assert not result.timed_out


def test_stdout_and_stderr_are_kept_apart() -> None:
    result = LocalTransport().execute(["sh", "-c", "echo to-out; echo to-err >&2; echo more-out"])
    assert result.stdout == "to-out\nmore-out\n"
    assert result.stderr == "to-err\n"


def test_missing_program_is_127_like_a_shell() -> None:
    result = LocalTransport().execute(["/nonexistent/fleetfix-no-such-program"])
    assert result.exit_code == 127
    assert "fleetfix-no-such-program" in result.stderr


def test_killed_by_signal_reports_128_plus_n() -> None:
    result = LocalTransport().execute(["sh", "-c", "kill -TERM $$"])
    assert result.exit_code == 128 + 15


def test_timeout_kills_the_whole_process_group() -> None:
    child, grandchild = unique_sleep(), unique_sleep()
    started = time.monotonic()
    result = LocalTransport().execute(
        ["sh", "-c", f"sleep {grandchild} & sleep {child}; echo never"], timeout=0.5
    )
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code == 124 and not result.ok
    assert "never" not in result.stdout
    assert alive(child) == [] and alive(grandchild) == []


def test_one_megabyte_each_way_without_deadlock() -> None:
    # The command writes 1 MB before it reads its 1 MB of stdin: pipes fill both ways at once.
    data = os.urandom(1 << 20)
    script = "head -c 1048576 /dev/zero; sha256sum >&2"
    result = LocalTransport().execute(["sh", "-c", script], stdin=data, timeout=30)
    assert result.exit_code == 0
    assert len(result.stdout) == 1 << 20
    assert result.stderr.split()[0] == hashlib.sha256(data).hexdigest()


def test_run_script_sends_the_script_on_stdin() -> None:
    result = run_script(LocalTransport(), 'set -- "a b" c\necho "$#:$1"\n')
    assert result.stdout == "2:a b\n"


def test_empty_argv_is_rejected() -> None:
    with pytest.raises(ValueError):
        LocalTransport().execute([])


def test_a_feed_sent_directly_keeps_its_order_when_a_chunk_must_wait() -> None:
    sent: list[bytes | None] = []

    def send(chunk: bytes | None) -> bool:  # takes chunks until one is "too large", as the SSH writer does
        if chunk is not None and len(chunk) > 5:
            return False
        sent.append(chunk)
        return True

    feed = StdinFeed()
    feed.put(b"a")  # queued before the transport takes over: sent first
    feed.send_directly(send)
    feed.put(b"b")
    feed.put(b"too large")
    feed.put(b"c")  # after one that waits: queued behind it, never overtaking it
    feed.close()
    assert sent == [b"a", b"b"]
    assert list(feed) == [b"too large", b"c"]


def test_what_a_feed_queued_before_it_is_sent_directly_goes_as_one_chunk() -> None:
    # A batch's first ids, queued while its channel opens: one packet, not one each.
    sent: list[bytes | None] = []
    feed = StdinFeed()
    for line in (b"200\n", b"201\n", b"202\n"):
        feed.put(line)
    feed.send_directly(lambda chunk: sent.append(chunk) is None)
    feed.put(b"203\n")
    assert sent == [b"200\n201\n202\n", b"203\n"]


def test_a_feed_closed_before_it_is_sent_directly_sends_its_data_then_eof() -> None:
    sent: list[bytes | None] = []
    feed = StdinFeed()
    feed.put(b"200\n")
    feed.put(b"201\n")
    feed.close()
    feed.send_directly(lambda chunk: sent.append(chunk) is None)
    assert sent == [b"200\n201\n", None]
    assert not feed.put(b"202\n")
