"""Many containers over one node channel (guests/pctbatch.py): the real Perl driver, run on this machine as
the node (LocalTransport), with a `pct` stand-in on PATH that runs `pct exec CTID -- argv...` here, in a
directory per container."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fleetfix.errors import GuestError
from fleetfix.guests.pctbatch import BatchCommand, PctBatch, _Frame, _FrameReader
from fleetfix.transport.base import CommandResult, StdinFeed
from fleetfix.transport.local import LocalTransport

# CT 900: stopped, as real pct says it. CT 901: pct itself hangs (lxc-attach stuck), ignoring the
# container's watchdog. Otherwise: the command runs in <root>/ct<ID>, the container's own directory.
PCT = """#!/bin/sh
[ "$1" = exec ] || exit 2
id=$2; shift 3
echo "$id" >>"{root}/started"
[ "$id" = 900 ] && {{ echo "container '900' not running!" >&2; exit 255; }}
[ "$id" = 901 ] && exec sleep 3600
mkdir -p "{root}/ct$id" && cd "{root}/ct$id" && exec "$@"
"""

# What every container runs (its stdin is this script): says which container it is (its directory), and
# that it ran to the end.
SCRIPT = """c=${PWD##*/}
echo "$c ran"
echo "to stderr from $c" >&2
[ -f slow ] && sleep 3600
[ -f loud ] && head -c 100000 /dev/zero
echo "$c done"
exit 3
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pct = bin_dir / "pct"
    pct.write_text(PCT.format(root=tmp_path))
    pct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def started(root: Path) -> list[int]:
    path = root / "started"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


# What the node itself runs when asked (the probe's node facts): its stdin is not the containers'.
NODE_SCRIPT = """echo node ran
if read -r line; then echo "stdin: $line"; else echo "stdin: none"; fi
echo "node stderr" >&2
exit 4
"""


def batch(expected: int, *, timeout: float = 60, max_output: int = 1 << 20, stdin: str = SCRIPT,
          node: LocalTransport | None = None, node_script: str = "",
          argv: Sequence[str] = ("/bin/sh", "-s")) -> PctBatch:
    return PctBatch(node or LocalTransport("pve1"), "pve1", BatchCommand(argv, stdin, timeout, node_script),
                    max_output=max_output, expected=expected)


def run(pct_batch: PctBatch, ctid: int) -> CommandResult | None:
    """One container through the batch, waiting for it as Fleet's node thread does."""
    submitted = pct_batch.submit(ctid)
    if submitted is None:
        return None
    submitted.done.wait(max(0.0, submitted.deadline - time.monotonic()))
    return pct_batch.result(submitted)


def run_all(pct_batch: PctBatch, ctids: Sequence[int]) -> dict[int, CommandResult | GuestError | None]:
    results: dict[int, CommandResult | GuestError | None] = {}

    def one(ctid: int) -> None:
        try:
            results[ctid] = run(pct_batch, ctid)
        except GuestError as error:
            results[ctid] = error

    threads = [threading.Thread(target=one, args=(ctid,)) for ctid in ctids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_each_container_gets_its_own_output_exit_code_and_the_whole_stdin(node: Path) -> None:
    results = run_all(batch(3), [200, 201, 202])
    for ctid in (200, 201, 202):
        result = results[ctid]
        assert isinstance(result, CommandResult)
        assert result.exit_code == 3 and not result.timed_out
        assert result.stdout == f"ct{ctid} ran\nct{ctid} done\n"  # each got the whole script
        assert result.stderr == f"to stderr from ct{ctid}\n"
    assert sorted(started(node)) == [200, 201, 202]


def test_a_stopped_container_is_a_guest_error_and_the_others_run(node: Path) -> None:
    results = run_all(batch(2), [900, 200])
    assert isinstance(results[900], GuestError) and "CT 900 on pve1 is stopped" in str(results[900])
    assert isinstance(results[200], CommandResult) and results[200].exit_code == 3


def test_the_containers_watchdog_times_out_one_without_holding_up_the_others(node: Path) -> None:
    (node / "ct201").mkdir()
    (node / "ct201" / "slow").touch()
    began = time.monotonic()
    results = run_all(batch(2, timeout=2), [200, 201])
    slow, quick = results[201], results[200]
    assert isinstance(slow, CommandResult) and slow.timed_out and slow.exit_code == 124
    assert "fleetfix: timed out after 2s" in slow.stderr
    assert isinstance(quick, CommandResult) and quick.exit_code == 3 and quick.duration < 2
    assert time.monotonic() - began < 20


def test_the_node_backstop_kills_a_hung_pct(node: Path) -> None:
    # pct itself hangs: the container's watchdog never runs; the driver kills pct's process group at the
    # backstop (timeout + 2 s) and the result is a timeout.
    results = run_all(batch(1 + 1, timeout=1), [901, 200])
    hung = results[901]
    assert isinstance(hung, CommandResult) and hung.timed_out and hung.exit_code == 124
    assert 3 <= hung.duration < 15
    assert isinstance(results[200], CommandResult) and results[200].exit_code == 3


def test_output_over_the_cap_is_cut_on_the_node_and_counted(node: Path) -> None:
    (node / "ct200").mkdir()
    (node / "ct200" / "loud").touch()
    [result] = run_all(batch(1, max_output=4096), [200]).values()
    assert isinstance(result, CommandResult)
    assert len(result.stdout.encode()) == 4096 and result.stdout.startswith("ct200 ran\n")
    assert result.dropped == len("ct200 ran\n") + 100_000 + len("ct200 done\n") - 4096


def test_the_node_starts_only_the_containers_it_is_given(node: Path) -> None:
    # Ids go to the node as each target starts: a target never started (an interrupt) never runs there.
    pct_batch = batch(3)
    results = run_all(pct_batch, [200])
    pct_batch.close()
    assert isinstance(results[200], CommandResult)
    time.sleep(0.5)
    assert started(node) == [200]
    assert run(pct_batch, 201) is None  # closed: the caller would run it on its own channel


def test_without_perl_every_container_is_left_to_its_own_channel(node: Path, tmp_path: Path) -> None:
    no_perl = LocalTransport("pve1", env={"PATH": str(node / "bin")})  # pct, but no perl
    pct_batch = batch(2, node=no_perl, node_script=NODE_SCRIPT)
    node_job = pct_batch.submit_node()
    assert node_job is not None
    assert run_all(pct_batch, [200, 201]) == {200: None, 201: None}
    assert pct_batch.node_result(node_job) is None  # the node script too
    assert pct_batch.error is not None and started(node) == []


def test_the_node_script_runs_on_the_node_itself_alongside_the_containers(node: Path) -> None:
    pct_batch = batch(2, node_script=NODE_SCRIPT)
    node_job = pct_batch.submit_node()
    assert node_job is not None and pct_batch.submit_node() is None  # once per batch
    results = run_all(pct_batch, [200, 201])
    assert all(isinstance(result, CommandResult) and result.exit_code == 3 for result in results.values())
    result = pct_batch.node_result(node_job)
    assert isinstance(result, CommandResult) and not result.timed_out
    assert (result.exit_code, result.stdout, result.stderr) == (4, "node ran\nstdin: none\n", "node stderr\n")
    assert sorted(started(node)) == [200, 201]  # not through pct


def test_a_node_script_that_hangs_is_a_timeout_after_the_callers_wait(node: Path) -> None:
    pct_batch = batch(1, timeout=2, node_script="sleep 3600\n")  # the node kills it at its backstop, 4 s
    began = time.monotonic()
    node_job = pct_batch.submit_node()
    assert node_job is not None
    result = pct_batch.node_result(node_job, timeout=1)
    assert isinstance(result, CommandResult) and result.timed_out and result.exit_code == 124
    assert 1 <= time.monotonic() - began < 10
    assert isinstance(run(pct_batch, 200), CommandResult)  # the containers go on
    pct_batch.close()


def test_the_node_script_is_only_run_when_there_is_one_and_the_batch_is_open(node: Path) -> None:
    assert batch(2).submit_node() is None
    pct_batch = batch(1, node_script=NODE_SCRIPT)
    assert pct_batch.submit(0) is None  # the node script's frame id: never a container's
    assert isinstance(run(pct_batch, 200), CommandResult)
    assert pct_batch.submit_node() is None  # every expected container fed: the node starts nothing more


def test_the_container_gets_the_default_sigpipe_not_the_drivers(node: Path) -> None:
    # The driver ignores SIGPIPE for itself; a pipeline in the container (`producer | head -1`) relies on
    # the producer dying of it, as it does under one channel per container.
    script = "awk '/^SigIgn:/ { print $2 }' /proc/self/status\n"
    [result] = run_all(batch(1, stdin=script), [200]).values()
    assert isinstance(result, CommandResult) and result.exit_code == 0
    assert int(result.stdout, 16) & (1 << (13 - 1)) == 0, result.stdout  # signal 13, SIGPIPE


def test_a_node_without_pct_says_so_as_one_channel_would(node: Path) -> None:
    no_pct = LocalTransport("pve1", env={"PATH": "/usr/bin:/bin"})  # perl, but no pct stand-in
    results = run_all(batch(2, node=no_pct), [200, 201])
    for error in results.values():
        assert isinstance(error, GuestError) and "pct was not found on pve1" in str(error)


# Each container's stdin is a pipe of its own, fed by the driver: what one container does to its stdin
# cannot reach another's, and one that reads slowly, never or not at all holds up nobody else.
# (In a container directory: `attack` reopens its stdin for writing; `noread` never reads it and ends
# when the file `go` appears beside it; `quit` exits at once; the rest count and hash what they read.)
FEEDING = """if [ -f attack ]; then echo "echo payload" >/proc/self/fd/0; echo attacked
elif [ -f noread ]; then while [ ! -f go ]; do sleep 0.05; done; echo never read
elif [ -f quit ]; then echo quit
else wc -c; fi
"""
# Over a pipe's buffer (64 KiB on Linux, pipe(7)), so the driver feeds it in parts; under the 128 KiB that
# one argument of the node's command line may be (MAX_ARG_STRLEN, execve(2)).
BIG_INPUT = "".join(f"line {number:07d} of the input\n" for number in range(3800))


def mark(node: Path, ctid: int, name: str) -> None:
    (node / f"ct{ctid}").mkdir(exist_ok=True)
    (node / f"ct{ctid}" / name).touch()


def test_a_container_that_rewrites_its_stdin_changes_no_other_containers_input(node: Path) -> None:
    mark(node, 200, "attack")
    sent = "the input as it was sent\n" * 10  # room to spare in the pipe: the attacker's write never waits
    pct_batch = batch(2, argv=("/bin/sh", "-c", FEEDING), stdin=sent)
    attacker = run(pct_batch, 200)  # done before the other is even started
    assert isinstance(attacker, CommandResult) and attacker.stdout == "attacked\n", attacker
    victim = run(pct_batch, 201)
    assert isinstance(victim, CommandResult) and victim.exit_code == 0, victim
    assert victim.stdout == f"{len(sent)}\n"  # the input as it was sent, and all of it


def test_an_input_bigger_than_a_pipe_reaches_every_container_whole(node: Path) -> None:
    assert len(BIG_INPUT.encode()) > 65536
    ctids = list(range(200, 206))
    results = run_all(batch(len(ctids), argv=("/bin/sh", "-c", "sleep 0.3; cat"), stdin=BIG_INPUT), ctids)
    for ctid in ctids:
        result = results[ctid]
        assert isinstance(result, CommandResult) and result.exit_code == 0, result
        assert result.stdout == BIG_INPUT  # in order, nothing lost or repeated where a write was partial


def test_a_container_that_never_reads_its_stdin_holds_up_no_other(node: Path) -> None:
    mark(node, 200, "noread")
    pct_batch = batch(3, argv=("/bin/sh", "-c", FEEDING), stdin=BIG_INPUT)
    blocked = pct_batch.submit(200)
    assert blocked is not None
    results = run_all(pct_batch, [201, 202])  # while 200's pipe is full and stays full
    for ctid in (201, 202):
        result = results[ctid]
        assert isinstance(result, CommandResult) and result.stdout == f"{len(BIG_INPUT)}\n", result
    assert not blocked.done.is_set()
    mark(node, 200, "go")
    assert blocked.done.wait(20)
    result = pct_batch.result(blocked)
    assert isinstance(result, CommandResult) and (result.exit_code, result.stdout) == (0, "never read\n")


def test_a_container_that_exits_at_once_is_framed_and_the_batch_goes_on(node: Path) -> None:
    # Its pipe's reader is gone before the input is: the driver's write fails (EPIPE, SIGPIPE ignored),
    # and it stops feeding that pipe only.
    for ctid in (200, 202):
        mark(node, ctid, "quit")
    results = run_all(batch(4, argv=("/bin/sh", "-c", FEEDING), stdin=BIG_INPUT), [200, 201, 202, 203])
    for ctid, said in ((200, "quit\n"), (201, f"{len(BIG_INPUT)}\n"), (202, "quit\n"),
                       (203, f"{len(BIG_INPUT)}\n")):
        result = results[ctid]
        assert isinstance(result, CommandResult) and (result.exit_code, result.stdout) == (0, said), result


def test_the_input_is_the_containers_own_pipe_and_it_holds_no_other_descriptor(node: Path) -> None:
    # Three at once, so the others' pipes are open in the driver while each starts: none of them may
    # cross into a container (ls's own descriptor for /proc/self/fd is the 3).
    script = "sleep 0.5; stat -L -c %F /proc/self/fd/0; ls /proc/self/fd\n"
    results = run_all(batch(3, argv=("/bin/sh", "-c", script)), [200, 201, 202])
    for result in results.values():
        assert isinstance(result, CommandResult) and result.exit_code == 0, result
        assert result.stdout == "fifo\n0\n1\n2\n3\n", result.stdout


def frames_of(data: bytes, cut: Callable[[bytes], list[bytes]]) -> tuple[list[_Frame], bool]:
    got: list[_Frame] = []
    broken: list[bool] = []
    reader = _FrameReader(got.append, on_broken=lambda: broken.append(True))
    for chunk in cut(data):
        reader("stdout", chunk)
    return got, bool(broken)


STREAM = (b"fleetfix-batch 200 0 3 4 0\nouterr!"
          b"fleetfix-batch 201 137 0 2 9\nx\n")


@pytest.mark.parametrize("cut", [
    lambda data: [data],
    lambda data: [data[i:i + 1] for i in range(len(data))],  # one byte at a time
    lambda data: [data[:30], data[30:]],  # a header split across chunks
])
def test_frames_are_read_however_the_stream_is_cut(cut: Callable[[bytes], list[bytes]]) -> None:
    got, broken = frames_of(STREAM, cut)
    assert not broken
    assert got == [_Frame(200, 0, b"out", b"err!", 0), _Frame(201, 137, b"", b"x\n", 9)]


def test_a_stream_that_is_not_frames_stops_the_reader() -> None:
    got, broken = frames_of(b"Welcome to the node!\n" + STREAM, lambda data: [data])
    assert broken and got == []


def test_a_fed_stdin_reaches_a_local_command_as_it_is_fed() -> None:
    feed = StdinFeed()
    seen: list[bytes] = []
    answered = threading.Event()

    def on_output(_stream: str, chunk: bytes) -> None:
        seen.append(chunk)
        answered.set()

    result: list[CommandResult] = []
    runner = threading.Thread(target=lambda: result.append(LocalTransport().execute_fed(
        ["/bin/sh", "-c", 'while read -r line; do echo "got $line"; done'], feed, on_output=on_output)))
    runner.start()
    feed.put(b"one\n")
    assert answered.wait(10), "the first line was not delivered before EOF"
    feed.put(b"two\n")
    feed.close()
    runner.join(10)
    assert result[0].stdout == "got one\ngot two\n" and result[0].exit_code == 0
