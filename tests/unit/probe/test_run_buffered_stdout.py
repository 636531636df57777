"""`with_buffered_stdout`: the probe's stdout reaches the controller in one piece, byte for byte the same.

Run with this machine's /bin/sh (dash on Debian, like the containers), and bash when present.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time

import pytest

from fleetfix.probe import build_probe_script
from fleetfix.probe.run import gather_facts, with_buffered_stdout
from fleetfix.target import NodeRef, Target
from fleetfix.transport.fake import ANY, FakeTransport

SHELLS = [shell for shell in ("/bin/sh", shutil.which("bash"), shutil.which("busybox")) if shell]


def run(shell: str, script: str) -> subprocess.CompletedProcess[bytes]:
    argv = [shell, "sh", "-s"] if shell.endswith("busybox") else [shell, "-s"]
    return subprocess.run(argv, input=script.encode(), capture_output=True, timeout=30)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    "script",
    [
        "printf 'a\\n\\n\\n'",  # trailing newlines survive command substitution
        "printf 'no newline'",
        "echo one; echo two >&2; echo three; exit 3",  # the script's own exit ends only its subshell
        "set -- x 'y z'; for a in \"$@\"; do echo \"[$a]\"; done; case $1 in x) echo case;; esac",
        "cat <<'EOF'\n) unbalanced ( and $(not run) and `neither`\nEOF",
        "",
        "# only a comment",
    ],
)
def test_output_and_exit_status_are_unchanged(shell: str, script: str) -> None:
    plain, buffered = run(shell, script), run(shell, with_buffered_stdout(script))
    assert (buffered.stdout, buffered.stderr, buffered.returncode) == (
        plain.stdout, plain.stderr, plain.returncode,
    )


def test_stdout_comes_only_when_the_script_ends() -> None:
    script = with_buffered_stdout("echo first; sleep 0.6; echo second")
    process = subprocess.Popen(["/bin/sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(script.encode())
    process.stdin.close()
    started = time.monotonic()
    early, _, _ = select.select([process.stdout], [], [], 0.3)
    assert not early, "unbuffered: 'first' arrived before the script ended"
    assert os.read(process.stdout.fileno(), 100) == b"first\nsecond\n"
    assert time.monotonic() - started >= 0.5
    process.wait(timeout=10)


def test_the_real_probe_gives_the_same_facts_buffered() -> None:
    script = build_probe_script()
    plain, buffered = run("/bin/sh", script), run("/bin/sh", with_buffered_stdout(script))
    assert buffered.returncode == plain.returncode == 0
    # Live values (free memory, disk) may move between the two runs; the shape and the rest may not.
    assert buffered.stdout.splitlines()[0][:200] == plain.stdout.splitlines()[0][:200]
    assert buffered.stdout.count(b"\n") == plain.stdout.count(b"\n")


def test_gather_facts_sends_the_probe_buffered() -> None:
    probe_output = run("/bin/sh", build_probe_script()).stdout.decode()
    transport = FakeTransport().on(ANY, stdout=probe_output)
    facts = gather_facts(Target("t", NodeRef("n", None)), transport)
    assert facts.hostname
    assert [call.stdin for call in transport.calls] == [with_buffered_stdout(build_probe_script()).encode()]
