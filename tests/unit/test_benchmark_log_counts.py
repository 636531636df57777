"""The benchmark's sshd log counter, on lines as OpenSSH 9.2 (LogLevel DEBUG1) writes them.

The e2e smoke test (tests/e2e/test_benchmark_smoke.py) counts a real fleet; this pins the refused-open
case, which a 3-container smoke bed never reaches (it stays under MaxSessions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from benchmarks.measure import SshCounts, SshdLogCounter

BEFORE = "sshd[10]: Accepted publickey for root from 127.0.0.1 port 40000 ssh2: ED25519 SHA256:x\n"
RUN = """\
sshd[11]: Accepted publickey for root from 127.0.0.1 port 40002 ssh2: ED25519 SHA256:x
sshd[11]: debug1: server_input_channel_open: ctype session rchan 0 win 2097152 max 32768
sshd[11]: debug1: session_new: session 0
sshd[11]: debug1: server_input_channel_open: ctype session rchan 1 win 2097152 max 32768
sshd[11]: no more sessions
sshd[11]: debug1: session open failed, free channel 1
sshd[11]: debug1: server_input_channel_open: failure session
sshd[11]: debug1: server_input_channel_open: ctype session rchan 2 win 2097152 max 32768
sshd[11]: debug1: session_new: session 1
"""


@dataclass
class LoggingNode:
    log_path: Path


def test_counts_only_what_was_logged_since_start_and_splits_off_refused_opens(tmp_path: Path) -> None:
    log = tmp_path / "sshd.log"
    log.write_text(BEFORE)
    counter = SshdLogCounter(cast(Any, {"pve1": LoggingNode(log), "pve2": LoggingNode(tmp_path / "none")}))
    counter.start()
    with log.open("a") as handle:
        handle.write(RUN)
    assert counter.per_node() == {
        "pve1": SshCounts(connections=1, channels=2, refused=1),
        "pve2": SshCounts(connections=0, channels=0, refused=0),
    }
