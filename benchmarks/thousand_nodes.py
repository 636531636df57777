"""A thousand nodes on one controller: `fleetfix probe` against the paramiko reference, 1,000 nodes x 2 CTs.

    python -m benchmarks.thousand_nodes --nodes 1000 --cts 2 [--forks 32,1000] [--nofile 1024] [--json FILE]

The nodes are light and their SSH is real. One real OpenSSH sshd configuration (a tests/lab node: its host
key, authorized key, private mount namespace and `pct` in its /usr/local/sbin) serves every node address:
the harness listens on 127.1.X.Y:PORT, one loopback address per node, and hands each accepted connection
to its own `sshd -i` (inetd mode: the same key exchange, authentication and sessions as sshd's own
per-connection child) entered into that node's namespace. The controller dials N distinct addresses and
checks each one's host key against a known_hosts of N entries (`[127.1.X.Y]:PORT`). `pct exec CTID`
answers with a recorded probe output (benchmarks/scale.py's stand-in: one `cat`), so the node's side costs
little and the controller's cost shows.

Per run (`fleetfix probe -i inventory.yaml --json --forks F`, then the paramiko reference,
benchmarks/paramiko_ref.py, with the same forks and channels): wall, controller CPU (os.wait4) and CPU per
node, peak RSS, and sampled every 0.2 s from /proc: the process's threads and open file descriptors at
their peak. Each controller runs with RLIMIT_NOFILE's soft limit set to --nofile (1024: Linux's default
soft limit, whatever this shell has), the hard limit left as it is; each may raise its own soft limit up
to the hard one (fleetfix to what its nodes need, the reference to the hard limit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import selectors
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fleet_probe import _python_env
from benchmarks.measure import Measured, Watch, compile_fleetfix, measure
from benchmarks.scale import SCALE_PCT, record_outputs
from tests.lab.bed import Lab

REPO = Path(__file__).resolve().parents[1]
FIRST_CTID = 100
SAMPLE_INTERVAL = 0.2
DEFAULT_NOFILE = 1024  # Linux's default soft RLIMIT_NOFILE


def node_address(index: int) -> str:
    """Node index -> its own loopback address, 127.1.0.1 ... 127.1.3.250 for a thousand."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


class ManyAddressSshd:
    """Listens on one loopback address per node and runs `sshd -i` for every connection, in the lab node's
    namespace, with its config: one real sshd configuration serving every address."""

    def __init__(self, work: Path, nodes: int, cts: int) -> None:
        self.lab = Lab(work / "lab", nodes=1)
        self.node = next(iter(self.lab.nodes.values())).ssh
        outputs = work / "recorded"
        record_outputs(outputs, "node", range(FIRST_CTID, FIRST_CTID + cts), seed=41)
        pct = self.node.sbin_dir / "pct"
        pct.write_text(SCALE_PCT.format(dir=shlex.quote(str(outputs))))
        pct.chmod(0o755)
        self.log_path = work / "sshd-i.log"
        assert self.node.process is not None
        self.argv = ["nsenter", "-t", str(self.node.process.pid), "-m", "-u", "--", "/usr/sbin/sshd", "-i",
                     "-f", str(self.node.state_dir / "sshd_config"), "-E", str(self.log_path)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < nodes + 64:  # the bed's listeners are the harness's, not the controller's
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, nodes + 4096), hard))
        self.addresses = [node_address(i) for i in range(nodes)]
        self.port = self._bind_all()
        self.children: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _bind_all(self) -> int:
        for port in range(22200, 23200):
            sockets: list[socket.socket] = []
            try:
                for address in self.addresses:
                    sock = socket.socket()
                    sockets.append(sock)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((address, port))
                    sock.listen(128)
                    sock.setblocking(False)
            except OSError:
                for sock in sockets:
                    sock.close()
                continue
            self.sockets = sockets
            return port
        raise RuntimeError("no port free on every node address")

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        for sock in self.sockets:
            selector.register(sock, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in selector.select(0.2):
                listener: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                with conn:
                    conn.setblocking(True)
                    self.children.append(subprocess.Popen(
                        self.argv, stdin=conn, stdout=conn, stderr=subprocess.DEVNULL, close_fds=True))
            self.children = [child for child in self.children if child.poll() is None]
        selector.close()

    def known_hosts(self, path: Path) -> Path:
        path.write_text("".join(f"[{address}]:{self.port} {self.node.host_key_line}\n"
                                for address in self.addresses))
        return path

    def accepted(self) -> int:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text.count("Accepted publickey for")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.sockets:
            sock.close()
        for child in self.children:
            child.kill()
            child.wait()
        self.lab.close()


@dataclass
class Run:
    tool: str
    forks: int
    nodes: int
    targets: int
    ok: int
    returncode: int
    wall_s: float
    cpu_s: float
    maxrss_kib: int
    peak_threads: int
    peak_fds: int
    connections: int
    nofile: int
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_ms_per_node(self) -> float:
        return 1000 * self.cpu_s / max(1, self.nodes)


def _sample_peaks(pid: int, peaks: dict[str, int]) -> None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return
    threads = re.search(r"^Threads:\s+(\d+)", status, re.M)
    rss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
    if threads is None or rss is None:  # exited, not yet reaped: a zombie has no memory lines
        return
    peaks["threads"] = max(peaks["threads"], int(threads.group(1)))
    peaks["fds"] = max(peaks["fds"], fds)
    peaks["rss_kib"] = max(peaks["rss_kib"], int(rss.group(1)))


def run_measured(argv: Sequence[str], cwd: Path, nofile: int,
                 timeout: float) -> tuple[Measured, dict[str, int]]:
    """argv under RLIMIT_NOFILE soft = nofile: what measure() says, and its process's peak threads, open
    descriptors and RSS (KiB)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))

    peaks = {"threads": 0, "fds": 0, "rss_kib": 0}
    watch = Watch(before_exec=limit, sample=lambda pid: _sample_peaks(pid, peaks), interval=SAMPLE_INTERVAL)
    return measure(argv, env=_python_env(), cwd=cwd, timeout=timeout, watch=watch), peaks


def run_tool(bed: ManyAddressSshd, tool: str, cts: int, forks: int, work: Path, *, nofile: int,
             connect_timeout: float) -> Run:
    rundir = work / f"{tool}-{forks}"
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    known_hosts = bed.known_hosts(rundir / "known_hosts")
    ctids = list(range(FIRST_CTID, FIRST_CTID + cts))
    nodes = [{"name": f"n{i:04d}", "address": address, "port": bed.port, "proxy_port": None, "ctids": ctids}
             for i, address in enumerate(bed.addresses)]
    if tool == "fleetfix":
        inventory = {"defaults": {"identity_file": str(bed.lab.client_key), "known_hosts": str(known_hosts)},
                     "nodes": [{"name": n["name"], "address": n["address"], "port": n["port"],
                                "containers": [{"ctid": ctid} for ctid in ctids]} for n in nodes]}
        (rundir / "inventory.yaml").write_text(json.dumps(inventory))  # JSON is YAML
        argv = [sys.executable, "-m", "fleetfix", "probe", "-i", "inventory.yaml", "--json",
                f"--forks={forks}", f"--connect-timeout={connect_timeout:g}"]
    else:
        spec = {"identity": str(bed.lab.client_key), "known_hosts": str(known_hosts), "forks": forks,
                "channels_per_node": 8, "nodes": nodes, "timeout": connect_timeout}
        (rundir / "spec.json").write_text(json.dumps(spec))
        argv = [sys.executable, "-m", "benchmarks.paramiko_ref", str(rundir / "spec.json")]
    accepted, load = bed.accepted(), os.getloadavg()[0]
    measured, peaks = run_measured(argv, rundir, nofile, timeout=1800)
    rc, wall, cpu, maxrss, stdout, stderr = (measured.returncode, measured.wall_s, measured.cpu_s,
                                             measured.maxrss_kib, measured.stdout, measured.stderr)
    ok, error = 0, ""
    try:
        if tool == "fleetfix":
            reports = json.loads(stdout)["targets"]
            ok = sum(1 for report in reports if not report.get("error"))
            errors = sorted({str(report["error"])[:200] for report in reports if report.get("error")})
            error = "; ".join(errors[:3])
        else:
            ok = int(json.loads(stdout.strip().splitlines()[-1])["ok"])
    except (ValueError, KeyError, IndexError):
        error = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
    return Run(tool, forks, len(nodes), len(nodes) * cts, ok, rc, wall, cpu, maxrss, peaks["threads"],
               peaks["fds"], bed.accepted() - accepted, nofile, error,
               {"peak_rss_sampled_kib": peaks["rss_kib"], "loadavg_before_after": [load, os.getloadavg()[0]],
                "stderr_tail": stderr[-600:]})


def render(runs: Sequence[Run]) -> str:
    lines = [f"{'tool':<10}{'forks':>6}{'ok':>11}{'wall s':>8}{'CPU s':>8}{'CPU/node ms':>13}{'RSS MiB':>9}"
             f"{'threads':>9}{'fds':>6}{'conns':>7}{'nofile':>8}{'load':>11}  error"]
    for run in runs:
        load = "/".join(f"{v:.1f}" for v in run.detail.get("loadavg_before_after", []))
        lines.append(f"{run.tool:<10}{run.forks:>6}{f'{run.ok}/{run.targets}':>11}{run.wall_s:>8.1f}"
                     f"{run.cpu_s:>8.2f}{run.cpu_ms_per_node:>13.2f}{run.maxrss_kib / 1024:>9.1f}"
                     f"{run.peak_threads:>9}{run.peak_fds:>6}{run.connections:>7}{run.nofile:>8}{load:>11}"
                     f"  {run.error[:120]}")
    by = {(run.tool, run.forks): run for run in runs}
    for forks in sorted({run.forks for run in runs}):
        mine, ref = by.get(("fleetfix", forks)), by.get(("paramiko", forks))
        if mine and ref and ref.cpu_s > 0:
            lines.append(f"forks {forks}: fleetfix / paramiko reference CPU per node "
                         f"{mine.cpu_s / ref.cpu_s:.2f}x (target <= 1.2x), peak RSS "
                         f"{mine.maxrss_kib / 1024:.0f} MiB (target <= 400)")
    return "\n".join(lines)


def measure_fleet(work: Path, nodes: int, cts: int, forks: Sequence[int], *, nofile: int = DEFAULT_NOFILE,
                  connect_timeout: float = 120, tools: Sequence[str] = ("fleetfix", "paramiko")) -> list[Run]:
    bed = ManyAddressSshd(work, nodes, cts)
    try:
        return [run_tool(bed, tool, cts, fork, work, nofile=nofile, connect_timeout=connect_timeout)
                for fork in forks for tool in tools]
    finally:
        bed.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--cts", type=int, default=2)
    parser.add_argument("--forks", default="32,1000", help="comma-separated: one run per value and tool")
    parser.add_argument("--nofile", type=int, default=DEFAULT_NOFILE,
                        help="the controllers' soft RLIMIT_NOFILE (default 1024, Linux's default)")
    parser.add_argument("--connect-timeout", type=float, default=120)
    parser.add_argument("--tools", default="fleetfix,paramiko", help="comma-separated: fleetfix, paramiko")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args(argv)
    compile_fleetfix()
    work = Path(tempfile.mkdtemp(prefix="fleetfix-thousand-"))
    try:
        runs = measure_fleet(work, options.nodes, options.cts, [int(f) for f in options.forks.split(",")],
                             nofile=options.nofile, connect_timeout=options.connect_timeout,
                             tools=options.tools.split(","))
    finally:
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{options.nodes} nodes x {options.cts} CTs, one sshd configuration on {options.nodes} loopback "
          f"addresses, {os.cpu_count()} CPUs")
    print(render(runs))
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps({"nodes": options.nodes, "cts": options.cts,
                                            "cpus": os.cpu_count(), "runs": [asdict(run) for run in runs]},
                                           indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
