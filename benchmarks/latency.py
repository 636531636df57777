"""One node's latency (issue 21): time to the first SSH packet, one container, eight containers.

    python -m benchmarks.latency --rtt-ms 20 --rounds 7 [--json FILE]

One test-bed node with 8 containers behind the latency proxy (benchmarks/fleet_probe.py's bed), then,
interleaved round by round (a burst of load elsewhere hits every row):

- `fleetfix probe --host H --port P --ct 200 --json`, the command as a user types it, in a fresh process;
- `ssh H pct exec 200 -- /bin/sh -s < probe`: a fresh OpenSSH connection running the same script fleetfix
  sends (its probe, stdout buffered: `probe.run.with_buffered_stdout(build_probe_script())`);
- `fleetfix probe --host H --ct 200 ... --ct 207`;
- the ControlMaster floor for those 8 (one master, `xargs -P 8` of mux clients, the node-facts script
  too: fleet_probe.write_floor_driver), with fleetfix's own probe script.

Each row: wall time from spawn to exit, CPU of the process tree (os.wait4), and the time from spawn to the
first bytes of SSH the proxy sees from that process (the client's identification line), from the proxy's
`--timestamps` log (CLOCK_MONOTONIC in both processes). Medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fleet_probe import (
    Bed,
    NodeSpec,
    _openssh_options,
    _python_env,
    start_fleet,
    write_floor_driver,
    write_proxy_known_hosts,
)
from benchmarks.measure import compile_fleetfix, measure
from fleetfix.probe import build_probe_script
from fleetfix.probe.run import with_buffered_stdout

REPO = Path(__file__).resolve().parents[1]


def _first_byte_after(log: Path, since: float) -> float | None:
    """Seconds from `since` to the first client bytes the proxy logged after it (None: no connection)."""
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        _, event, stamp, *_ = line.split()
        if event == "first" and float(stamp) >= since:
            return float(stamp) - since
    return None


def _fleetfix(bed: Bed, node: NodeSpec, ctids: list[int], known_hosts: Path) -> list[str]:
    argv = [sys.executable, "-m", "fleetfix", "probe", "--host", node.address, "--port",
            str(node.proxy_port or node.port), "--identity", str(bed.lab.client_key), "--known-hosts",
            str(known_hosts), "--json"]
    for ctid in ctids:
        argv += ["--ct", str(ctid)]
    return argv


def run_once(name: str, argv: list[str], log: Path, *, stdin_path: Path | None = None,
             cwd: Path = REPO) -> dict[str, Any]:
    env = _python_env()
    started = time.monotonic()
    if stdin_path is not None:
        with open(stdin_path, "rb") as stdin:
            run = measure(argv, env=env, cwd=cwd, stdin=stdin.fileno())
    else:
        run = measure(argv, env=env, cwd=cwd)
    first = _first_byte_after(log, started)
    if run.returncode not in (0, 3):  # 3: error findings (the lab's containers are broken on purpose)
        raise RuntimeError(f"{name} failed (exit {run.returncode}): {run.stderr[-1500:]}")
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s, "first_packet_s": first, "maxrss_kib": run.maxrss_kib}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    compile_fleetfix()
    work = Path(tempfile.mkdtemp(prefix="fleetfix-latency-"))
    log = work / "timestamps.log"
    bed = start_fleet(work, 1, 8, options.rtt_ms, timestamps=log)
    try:
        node = bed.nodes[0]
        known_hosts = work / "known_hosts.proxy"
        write_proxy_known_hosts(bed, [node], known_hosts)
        script = work / "probe-buffered.sh"
        script.write_text(with_buffered_stdout(build_probe_script()))
        floor_dir = work / "floor"
        floor = write_floor_driver(bed, [node], 8, floor_dir)
        ssh = ["ssh", *_openssh_options(bed, node), f"root@{node.address}", "pct", "exec", "200", "--",
               "/bin/sh", "-s"]
        rows: dict[str, tuple[list[str], Path | None, Path]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], None, REPO),
            "fleetfix probe, 1 CT": (_fleetfix(bed, node, [200], known_hosts), None, REPO),
            "ssh pct exec, 1 CT (fresh connection)": (ssh, script, REPO),
            "fleetfix probe, 8 CTs": (_fleetfix(bed, node, list(range(200, 208)), known_hosts), None, REPO),
            "floor (ControlMaster), 8 CTs": (["/bin/bash", str(floor)], None, floor_dir),
        }
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in rows}
        for round_index in range(options.rounds + 1):  # round 0 warms the page cache, not kept
            for name, (argv, stdin_path, cwd) in rows.items():
                sample = run_once(name, argv, log, stdin_path=stdin_path, cwd=cwd)
                if round_index:
                    samples[name].append(sample)
        result: dict[str, Any] = {"rtt_ms": options.rtt_ms, "rounds": options.rounds,
                                  "loadavg_after": os.getloadavg()[0], "rows": {}}
        for name, runs in samples.items():
            firsts = [r["first_packet_s"] for r in runs if r["first_packet_s"] is not None]
            result["rows"][name] = {
                "wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
                "wall_s_all": [round(r["wall_s"], 3) for r in runs],
                "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
                "first_packet_s": round(statistics.median(firsts), 4) if firsts else None,
                "first_packet_s_all": [round(f, 4) for f in firsts],
            }
        rows_out = result["rows"]
        result["ratios"] = {
            "1 CT: fleetfix / ssh": round(rows_out["fleetfix probe, 1 CT"]["wall_s"]
                                          / rows_out["ssh pct exec, 1 CT (fresh connection)"]["wall_s"], 3),
            "8 CTs: fleetfix / floor": round(rows_out["fleetfix probe, 8 CTs"]["wall_s"]
                                             / rows_out["floor (ControlMaster), 8 CTs"]["wall_s"], 3),
        }
        print(json.dumps(result, indent=1))
        print("argv:", shlex.join(rows["fleetfix probe, 1 CT"][0]), file=sys.stderr)
        if options.json:
            options.json.parent.mkdir(parents=True, exist_ok=True)
            options.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        bed.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
