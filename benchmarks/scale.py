"""Scale mode: the cost curve of one controller at 10, 100, 1,000 and 10,000 targets (issue 21).

    python -m benchmarks.scale [--steps 10,100,1000,10000] [--nights 2] [--json FILE]

10,000 real containers do not fit on one machine, so the containers are made cheap and everything on the
controller's side stays real: `fleetfix audit -i inventory.yaml --db ... --html ... --junit ... --prometheus
...` (the command itself, benchmarks/scale_cli.py, which only adds timers), real OpenSSH sshd nodes on
127.0.0.N (tests/lab), one SSH connection per node, its containers over one channel (guests/pctbatch.py) with
the real probe script on their stdin, node facts once per node, the probe's JSON parsed and diagnosed, every
result committed to the audit history, drift, and the three report files. Only `pct` differs: each node's `pct
exec CTID ...` reads the script and answers with that container's recorded probe output (the recorded fixtures
of tests/fixtures/probe in the dashboard benchmark's mix, each with its own hostname; 4% of containers answer
"not running", as a stopped one does).

Nodes hold 100 containers each (10 and 100 targets: one node). Each step audits its fleet `--nights`
times into a fresh history (the first night has no baseline; the next ones compute drift against it and
add to the history what a night adds). Per step and night: wall time, the whole process's CPU (os.wait4)
and peak RSS (and its value as each phase ended: probing, load_audit, reports), the audit's write time
(how long the store's lock was held: the writes' serial time; and the committing threads' CPU), load and
report time (scale_cli's timers), and the database's size. The bed's own work (sshd's sessions, the
stand-in) runs on the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.dashboard import PROFILES, _fixture
from benchmarks.fleet_probe import _python_env
from benchmarks.measure import compile_fleetfix, measure
from tests.lab.bed import Lab

REPO = Path(__file__).resolve().parents[1]
PER_NODE = 100
FIRST_CTID = 100

# `pct` on a scale node: stdin (the probe script) read and dropped, then the recorded output. No Python,
# one `cat`: the container's side costs as little as it can, so the controller's cost is what shows.
SCALE_PCT = """#!/bin/sh
[ "$1" = exec ] || {{ echo "pct (scale mode): only exec" >&2; exit 255; }}
cat > /dev/null
[ -f {dir}/"$2".json ] || {{ echo "container '$2' not running!" >&2; exit 255; }}
exec cat {dir}/"$2".json
"""


def record_outputs(directory: Path, node: str, ctids: range, seed: int) -> None:
    """One recorded probe output per container (a fixture in the dashboard's mix, its own hostname)."""
    rng = random.Random(f"{seed}-{node}")
    directory.mkdir(parents=True, exist_ok=True)
    cache: dict[str, dict[str, Any]] = {}
    for ctid in ctids:
        profile = rng.choices(list(PROFILES), weights=list(PROFILES.values()))[0]
        if profile == "down":
            continue
        name = "healthy" if profile == "dpkg" else profile
        if name not in cache:
            cache[name] = _fixture(name)
        data = {**cache[name], "hostname": f"{node}-ct{ctid}"}
        (directory / f"{ctid}.json").write_text(json.dumps(data))


def start_bed(work: Path, nodes: int, seed: int) -> Lab:
    started = time.monotonic()
    lab = Lab(work / "lab", nodes=nodes)
    for node in lab.nodes.values():
        outputs = work / "recorded" / node.name
        record_outputs(outputs, node.name, range(FIRST_CTID, FIRST_CTID + PER_NODE), seed)
        pct = node.ssh.sbin_dir / "pct"
        pct.write_text(SCALE_PCT.format(dir=shlex.quote(str(outputs))))
        pct.chmod(0o755)
    print(f"[scale] {nodes} scale nodes up in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    return lab


def write_inventory(lab: Lab, targets: int, path: Path) -> None:
    names = list(lab.nodes)
    count = max(1, -(-targets // PER_NODE))
    per_node = targets if count == 1 else PER_NODE
    inventory = {
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{"name": name, "address": lab.nodes[name].address, "port": lab.nodes[name].port,
                   "containers": [{"ctid": FIRST_CTID + i} for i in range(per_node)]}
                  for name in names[:count]],
    }
    path.write_text(json.dumps(inventory))  # JSON is YAML


def db_size(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db.stat().st_size


def run_step(lab: Lab, targets: int, nights: int, work: Path) -> list[dict[str, Any]]:
    step = work / f"step-{targets}"
    shutil.rmtree(step, ignore_errors=True)
    step.mkdir(parents=True)
    write_inventory(lab, targets, step / "inventory.yaml")
    db = step / "audit.db"
    rows = []
    for night in range(1, nights + 1):
        argv = [sys.executable, "-m", "benchmarks.scale_cli", "audit", "-i", "inventory.yaml",
                "--db", str(db), "--html", "report.html", "--junit", "report.xml",
                "--prometheus", "report.prom"]
        load_before = os.getloadavg()[0]
        run = measure(argv, env=_python_env(), cwd=step, timeout=3600)
        found = re.search(r"^SCALE (.*)$", run.stderr, re.M)
        if run.returncode not in (0, 3, 4) or found is None:
            raise RuntimeError(f"audit of {targets} failed (exit {run.returncode}): {run.stderr[-2000:]}")
        timers = json.loads(found.group(1))
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        row = {
            "targets": targets, "night": night, "wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
            "cpu_ms_per_target": round(1000 * run.cpu_s / targets, 2),
            "peak_rss_mib": round(run.maxrss_kib / 1024, 1),
            # the process's peak as each phase began and ended (scale_cli): probing, load_audit, reports
            "peak_rss_mib_phases": {key.removeprefix("peak_rss_mib_"): round(value, 1)
                                    for key, value in timers.items() if key.startswith("peak_rss_mib_")},
            "audit_write_s": round(timers["store_lock_held_s"], 2),  # serial: the store's lock held
            "audit_write_wall_incl_waits_s": round(timers["record_wall_s"], 2),
            "audit_write_cpu_s": round(timers["record_cpu_s"], 2),
            "audit_write_ms_per_target": round(
                1000 * timers["store_lock_held_s"] / max(1, timers["records"]), 3),
            "load_audit_s": round(timers["load_audit_s"], 2), "reports_s": round(timers["reports_s"], 2),
            "db_bytes": db_size(db), "html_bytes": (step / "report.html").stat().st_size,
            "summary": summary, "loadavg_before_after": [load_before, os.getloadavg()[0]],
        }
        rows.append(row)
        print(f"[scale] {json.dumps(row)}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="10,100,1000,10000", help="fleet sizes, comma-separated")
    parser.add_argument("--nights", type=int, default=2, help="audits per step, into one history")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args()
    compile_fleetfix()
    steps = [int(step) for step in options.steps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="fleetfix-scale-"))
    lab = start_bed(work, max(1, -(-max(steps) // PER_NODE)), options.seed)
    try:
        rows = [row for targets in steps for row in run_step(lab, targets, options.nights, work)]
    finally:
        lab.close()
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)
    header = (f"{'targets':>8}{'night':>6}{'wall s':>8}{'CPU s':>8}{'CPU/target ms':>15}{'RSS MiB':>9}"
              f"{'write s':>9}{'write ms/t':>11}{'load s':>8}{'reports s':>10}{'DB MB':>8}{'HTML MB':>9}")
    print(header)
    for row in rows:
        print(f"{row['targets']:>8}{row['night']:>6}{row['wall_s']:>8}{row['cpu_s']:>8}"
              f"{row['cpu_ms_per_target']:>15}{row['peak_rss_mib']:>9}{row['audit_write_s']:>9}"
              f"{row['audit_write_ms_per_target']:>11}{row['load_audit_s']:>8}{row['reports_s']:>10}"
              f"{row['db_bytes'] / 1e6:>8.2f}{row['html_bytes'] / 1e6:>9.2f}")
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps({"steps": steps, "nights": options.nights, "cpus": os.cpu_count(),
                                            "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
