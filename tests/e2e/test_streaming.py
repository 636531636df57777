"""Live output over the real path: SSH to a lab node, `pct exec` into a container, chunks as they come."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from fleetfix.guests.lxc import PctTransport
from fleetfix.target import SSHSettings
from fleetfix.transport.base import run_script
from fleetfix.transport.ssh import SSHConnection
from tests.e2e.conftest import host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container

# Prints a line, then waits for a file that the test creates only once the sink has seen that line.
HANDSHAKE = "echo first; while [ ! -f /tmp/stream-go ]; do sleep 0.05; done; echo second\n"


def test_pct_over_ssh_streams_before_the_command_ends(lab: Lab, make_ct: Callable[..., Container]) -> None:
    ct = make_ct()
    node = lab.node()
    settings = SSHSettings(node.address, node.port, identity_file=str(lab.client_key),
                           known_hosts=str(lab.known_hosts), connect_timeout=5)
    chunks: list[bytes] = []
    released: list[float] = []

    def sink(stream: str, chunk: bytes) -> None:
        chunks.append(chunk)
        if b"first\n" in b"".join(chunks) and not released:
            ct.sh("touch /tmp/stream-go")  # inside the container: only now can the script finish
            released.append(time.monotonic())

    with SSHConnection(settings) as connection:
        result = run_script(PctTransport(connection, ct.ctid), HANDSHAKE, timeout=30, on_output=sink)
    # Without streaming the first line would arrive only at the end, which never comes before the timeout.
    assert not result.timed_out and result.exit_code == 0, result
    assert released and result.stdout == "first\nsecond\n"
    assert b"".join(chunks) == b"first\nsecond\n"


def test_apply_verbose_prints_target_prefixed_lines(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct()
    book = tmp_path / "stream.yaml"
    book.write_text("name: stream\nsteps:\n  - name: say hello\n"
                    "    apply: echo hello-stream; echo to-err >&2\n")
    result = run_cli("-v", "apply", str(book), *host_args(lab, None, ct.ctid),
                     "--state-dir", str(tmp_path / "state"))
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(re.fullmatch(rf"\S+/{ct.ctid} \| hello-stream", line) for line in lines), result.stdout
    assert any(re.fullmatch(rf"\S+/{ct.ctid} ! to-err", line) for line in lines), result.stdout
    # Streamed, not replayed after the step: the line appears once, before the step's status line.
    streamed = next(i for i, line in enumerate(lines) if line.endswith("| hello-stream"))
    status = next(i for i, line in enumerate(lines) if "say hello" in line)
    assert streamed < status and sum(line.endswith("| hello-stream") for line in lines) == 1
    assert "    hello-stream" not in lines  # step_printer's after-the-fact replay is off while streaming
