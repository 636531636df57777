"""Measuring a child process (wall, CPU, peak RSS) and counting SSH work in the lab's sshd logs.

CPU and the largest process's RSS come from `os.wait4` on the child: the kernel's rusage of the child plus
every descendant it waited for (ssh clients under xargs, Ansible's forks), so nothing the tool spends on the
controller escapes the count, and the harness's own work (lab, proxy, this sampler) is never charged to it.
The RSS of the whole process tree (Ansible runs many processes at once) is sampled from /proc.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lab.sshd import SshNode

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
SAMPLE_INTERVAL = 0.5  # seconds between /proc scans: a scan costs a few ms of the harness's CPU
ACCEPTED = "Accepted publickey for"  # one line per authenticated TCP connection (sshd LogLevel DEBUG1)
SESSION_OPEN = "server_input_channel_open: ctype session"  # one line per session channel opened or refused
# sshd's session.c when MaxSessions are in use; it frees closed sessions lazily, so a burst of opens can
# draw this even below the limit. fleetfix retries such an open (ssh.OPEN_RETRY_DELAYS).
SESSION_REFUSED = "no more sessions"


@dataclass
class Measured:
    argv: list[str]
    returncode: int
    wall_s: float
    cpu_s: float  # user + system of the child and every descendant it reaped
    maxrss_kib: int  # the largest single process among them
    peak_tree_rss_kib: int  # the largest sum over the live process tree, sampled
    stdout: str
    stderr: str


def _tree_rss_kib(root: int) -> int:
    """Sum of RSS over root and its live descendants (one pass over /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid ...
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        rss[pid] = int(fields[21]) * PAGE_KIB
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total


def compile_fleetfix() -> None:
    """Write fleetfix's bytecode, as an installed package has it (scripts/install.sh and pip both compile).
    Where PYTHONDONTWRITEBYTECODE is set (this machine), an editable install left as it is would compile
    every module from source in every measured process: ~80 ms of CPU that no user pays."""
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "fleetfix", quiet=1)


@dataclass(frozen=True)
class Watch:
    """More of the child than measure() takes by itself: before_exec runs in the child before its program
    (e.g. a resource limit), sample(pid) at every sampling interval beside the tree's RSS."""

    before_exec: Callable[[], None] | None = None
    sample: Callable[[int], None] | None = None
    interval: float = SAMPLE_INTERVAL  # seconds between samples


def measure(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
    timeout: float = 1800.0, stdin: int | None = subprocess.DEVNULL, watch: Watch = Watch(),
) -> Measured:
    """Run argv to completion; its wall time, CPU and RSS as above. Output is captured to files, not pipes,
    so a chatty tool never blocks on us."""
    out_path = Path(cwd or ".") / f".measure-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"{out_path}.out", "wb+") as out, open(f"{out_path}.err", "wb+") as err:
        started = time.monotonic()
        process = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                                   stdin=stdin, stdout=out, stderr=err, preexec_fn=watch.before_exec)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(watch.interval):
                peak = max(peak, _tree_rss_kib(process.pid))
                if watch.sample is not None:
                    watch.sample(process.pid)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout, process.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            killer.cancel()
            done.set()
            sampler.join()
        wall = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped above: keep Popen from waiting
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink()
    return Measured(list(argv), process.returncode, wall, usage.ru_utime + usage.ru_stime,
                    usage.ru_maxrss, max(peak, usage.ru_maxrss), stdout, stderr)


@dataclass(frozen=True)
class SshCounts:
    connections: int
    channels: int  # session channels sshd accepted
    refused: int = 0  # session channel opens it refused (each retried or failed)


class SshdLogCounter:
    """Counts what each node's sshd logged since `start()`: authenticated connections, session channels
    accepted and refused."""

    def __init__(self, nodes: Mapping[str, SshNode]) -> None:
        self.nodes = dict(nodes)
        self._offsets: dict[str, int] = {}

    def start(self) -> None:
        self._offsets = {name: _size(node.log_path) for name, node in self.nodes.items()}

    def per_node(self) -> dict[str, SshCounts]:
        counts: dict[str, SshCounts] = {}
        for name, node in self.nodes.items():
            try:
                with open(node.log_path, "rb") as handle:
                    handle.seek(self._offsets.get(name, 0))
                    text = handle.read().decode(errors="replace")
            except FileNotFoundError:  # sshd has not written a line yet
                text = ""
            refused = text.count(SESSION_REFUSED)
            counts[name] = SshCounts(text.count(ACCEPTED), text.count(SESSION_OPEN) - refused, refused)
        return counts


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
