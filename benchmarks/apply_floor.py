"""The floor of `fleetfix apply`: the same rendered scripts run on each node through its local `pct exec`.

    python -m benchmarks.apply_floor --nodes 4 --cts 5 [--rtt-ms 0] [--json FILE]

On one bed (tests/lab: one real sshd per node on 127.0.0.N, overlay containers behind the `pct` stand-in,
each container set up as the e2e tests' problem case: torch 2.11.0+cu128, no nvcc, no NVIDIA repository;
the apt repository stand-in of tests/lab/aptrepo.py served on 127.0.0.1), in this order:

1. apply-change: `fleetfix apply playbooks/cuda-toolkit.yaml -i inventory.yaml --var cuda_repo_base=...`:
   every container changes (keyring, sources, apt-get update, the toolkit's packages);
2. apply-noop: the same command again: nothing to change, every step's check passes;
3. probe: `fleetfix probe -i inventory.yaml --json` on the same fleet;
4. floor-noop: the scripts apply-noop ran, taken byte for byte from its run record (--state-dir: every
   `script-start` event holds the rendered script as it went to the target; a target's check batch, the
   checks apply sent as one script, is made again from them and its `check-batch` event), run on the same
   containers;
5. the containers are made again as the problem case, then floor-change: the scripts apply-change ran.

A floor run is one process with no SSH and no controller logic: per node (at most `forks` nodes at once,
as fleetfix) and per container (at most `channels` at once, fleetfix's channels per node), first the facts
(the node-facts script once per node through `/bin/sh -s`, fleetfix's probe script per container through
`pct exec CTID -- /bin/sh -s`; where apply sent a target's check batch in its facts' command, that
batch too, in the same command, as apply does), then, once every container's facts are in (fleetfix plans
every target before it runs any), each container's other recorded scripts in their recorded order through
the node's own `pct exec CTID -- /bin/sh -s`, the script on stdin, as fleetfix's run_script sends it.
Every script's exit status must equal the recorded one (else the floor did other work and the run fails).

Per run: wall, controller CPU and peak RSS (os.wait4 of the command; for the floor, its driver's own CPU,
what a controller would spend: the pct processes and the containers' work are the nodes' side, and are
reported apart as node CPU), and the ratios asked for: apply-change / floor-change and apply-noop /
probe (and apply-noop / floor-noop). With --rtt-ms > 0 fleetfix dials each node through a latency proxy
(benchmarks/latency_proxy.py); the floor has no network, so the ratio then holds the RTT too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fleet_probe import (
    DEFAULT_CHANNELS,
    DEFAULT_FORKS,
    Bed,
    _python_env,
    start_fleet,
    write_cli_inventory,
)
from benchmarks.measure import compile_fleetfix, measure

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = "playbooks/cuda-toolkit.yaml"


@dataclass
class Row:
    run: str
    targets: int
    ok: int
    wall_s: float
    cpu_s: float  # the controller's: fleetfix's process; the floor driver's own threads
    maxrss_kib: int
    # the nodes' side: for the floor, pct, the shells and the containers' work (its tree less its driver);
    # for fleetfix, the same and sshd's side of the connections (what the nodes' sshds reaped)
    node_cpu_s: float | None = None
    scripts: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_ms_per_target(self) -> float:
        return 1000 * self.cpu_s / max(1, self.targets)


# -- the recorded scripts --------------------------------------------------------------------------------


def recorded_scripts(state_dir: Path) -> dict[str, list[tuple[str, str, int | None]]]:
    """The one run under state_dir: per target name, the scripts that went to it in order, as (phase,
    script, rc). A target's check batch (a `check-batch` event that was used) is one script, made again
    from the checks it ran: outside check mode those are the target's first recorded scripts. A batch
    that went with the facts has the phase WITH_FACTS: the floor sends it after its probe, in one command."""
    from fleetfix.playbook.checkbatch import batch_script, new_nonce
    from fleetfix.playbook.records import list_runs, load_run

    [summary] = list_runs(state_dir)
    detail = load_run(state_dir, summary.run_id)
    batches = {event["target"]: event for event in detail.events
               if event.get("kind") == "check-batch" and event.get("ran")}
    scripts: dict[str, list[tuple[str, str, int | None]]] = {}
    for name, record in detail.targets.items():
        ran = [((step.playbook, step.name), script) for step in record.steps for script in step.scripts]
        runs = [(script.phase, script.script, script.rc) for _, script in ran]
        batch = batches.get(name)
        if batch is not None:
            count = int(batch["ran"])
            held = [(entry["playbook"], entry["step"]) for entry in batch["steps"][:count]]
            if [where for where, _ in ran[:count]] != held or any(p != "check" for p, _, _ in runs[:count]):
                raise RuntimeError(f"{name}: the check batch's checks are not its first scripts")
            checks = [script for _, script, _ in runs[:count]]
            batched = batch_script(checks, new_nonce(), stop_at_failure=True)
            # Sent in the facts' own command (transport/session.py): the floor runs it with its probe.
            phase = WITH_FACTS if batch.get("with_facts") else "check-batch"
            runs = [(phase, batched, 0), *runs[count:]]
        scripts[name] = runs
    return scripts


WITH_FACTS = "check-batch-with-facts"


def floor_plan(fleet: Bed, scripts: dict[str, list[tuple[str, str, int | None]]]) -> dict[str, Any]:
    """What the floor driver runs: per node its pct, and per container its recorded scripts. Target names
    are `NODE/CTID` (or end in the CTID): mapped back to the bed's nodes."""
    nodes: dict[str, Any] = {}
    by_name = {node.name: node for node in fleet.nodes}
    for target, runs in scripts.items():
        node_name, _, ctid = target.rpartition("/")
        node = by_name.get(node_name) or next(n for n in fleet.nodes if target.startswith(n.name))
        entry = nodes.setdefault(node.name, {
            "pct": str(fleet.lab.nodes[node.name].ssh.sbin_dir / "pct"), "containers": {}})
        entry["containers"][ctid] = [{"phase": p, "script": s, "rc": rc} for p, s, rc in runs]
    return {"nodes": nodes}


# -- the floor driver (runs as its own process: `python -m benchmarks.apply_floor --drive PLAN`) ----------


# What an sshd session hands `pct exec` (and the stand-in passes into the container, as pct does without
# --keep-env 0): not the harness's own environment (PYTHONPATH, PYTHONDONTWRITEBYTECODE, ...).
SESSION_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "USER": "root", "LOGNAME": "root", "SHELL": "/bin/sh", "LANG": "C.UTF-8"}


def _sh(argv: Sequence[str], script: str) -> int:
    done = subprocess.run(list(argv), input=script.encode(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False, env=SESSION_ENV)
    return done.returncode


def drive(plan: dict[str, Any], forks: int, channels: int) -> dict[str, Any]:
    from fleetfix.probe import build_node_script, build_probe_script
    from fleetfix.probe.run import with_buffered_stdout
    from fleetfix.transport.session import head_script, new_nonce

    probe, node_script = with_buffered_stdout(build_probe_script()), build_node_script()
    shell = ["/bin/sh", "-s"]
    mismatches: list[str] = []
    lock = threading.Lock()

    def per_node(work: Any) -> None:  # every node at once, up to forks; its containers up to channels
        with ThreadPoolExecutor(max(1, min(forks, len(plan["nodes"])))) as pool:
            list(pool.map(work, plan["nodes"].items()))

    def facts(item: tuple[str, dict[str, Any]]) -> None:
        name, node = item

        def container(ctid: str) -> None:
            runs = node["containers"][ctid]
            if not runs or runs[0]["phase"] != WITH_FACTS:
                _sh([node["pct"], "exec", ctid, "--", *shell], probe)
                return
            # fleetfix's one command for both (transport/session.py), sent whole: the floor has no
            # controller to wait for the facts before it sends the batch.
            session = head_script(probe, new_nonce()) + runs[0]["script"]
            rc = _sh([node["pct"], "exec", ctid, "--", *shell], session)
            if rc != runs[0]["rc"]:
                with lock:
                    mismatches.append(f"{name}/{ctid} {WITH_FACTS}: exit {rc}, recorded {runs[0]['rc']}")

        with ThreadPoolExecutor(channels) as pool:
            pool.submit(_sh, shell, node_script)
            list(pool.map(container, node["containers"]))

    def steps(item: tuple[str, dict[str, Any]]) -> None:
        name, node = item

        def container(ctid: str) -> None:
            for run in node["containers"][ctid]:
                if run["phase"] == WITH_FACTS:
                    continue  # ran with the facts
                rc = _sh([node["pct"], "exec", ctid, "--", *shell], run["script"])
                if rc != run["rc"]:
                    with lock:
                        mismatches.append(f"{name}/{ctid} {run['phase']}: exit {rc}, recorded {run['rc']}")
                    return

        with ThreadPoolExecutor(channels) as pool:
            list(pool.map(container, node["containers"]))

    started = time.monotonic()
    per_node(facts)
    facts_s = time.monotonic() - started
    per_node(steps)
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"facts_s": round(facts_s, 3), "mismatches": mismatches,
            "driver_cpu_s": own.ru_utime + own.ru_stime,
            "scripts": sum(len(runs) for node in plan["nodes"].values()
                           for runs in node["containers"].values())}


# -- the runs --------------------------------------------------------------------------------------------


def node_cpu(fleet: Bed) -> float:
    """CPU seconds of everything the nodes' sshds have reaped: each connection's sshd, its sessions, `pct`
    and the containers' work under it (each level waits for the one below: it all lands in the listener's
    cutime/cstime once the connection has closed)."""
    total = 0
    for node in fleet.nodes:
        process = fleet.lab.nodes[node.name].ssh.process
        assert process is not None
        stat = Path(f"/proc/{process.pid}/stat").read_bytes()
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state is field 3
        total += int(fields[13]) + int(fields[14])  # cutime, cstime: fields 16 and 17
    return total / os.sysconf("SC_CLK_TCK")


def _node_cpu_after(fleet: Bed, before: float) -> float:
    """The nodes' CPU since `before`, once their sshds have reaped the run's connections."""
    deadline, last = time.monotonic() + 5, -1.0
    while time.monotonic() < deadline:
        now = node_cpu(fleet)
        if now == last:
            break
        last = now
        time.sleep(0.5)
    return last - before


def pct_execs(fleet: Bed) -> int:
    return sum(fleet.lab.nodes[node.name].pct_exec_count() for node in fleet.nodes)


def _cli(fleet: Bed, name: str, args: Sequence[str], rundir: Path) -> Row:
    argv = [sys.executable, "-m", "fleetfix", *args]
    load, execs, node_before = os.getloadavg()[0], pct_execs(fleet), node_cpu(fleet)
    counter = fleet.counter()
    counter.start()
    run = measure(argv, env={**_python_env(), "NO_COLOR": "1"}, cwd=rundir, timeout=3600)
    counts = counter.per_node().values()
    if run.returncode != 0:
        raise RuntimeError(f"{name}: exit {run.returncode}: {run.stderr[-2000:]}{run.stdout[-2000:]}")
    targets = json.loads(run.stdout)["targets"]
    good = {"ok", "changed"} if name.startswith("apply") else None
    ok = sum(1 for t in targets if (t.get("status") in good if good else not t.get("error")))
    statuses = sorted({str(t.get("status")) for t in targets}) if good else []
    return Row(name, len(targets), ok, run.wall_s, run.cpu_s, run.maxrss_kib,
               node_cpu_s=_node_cpu_after(fleet, node_before),
               detail={"statuses": statuses, "loadavg_before_after": [load, os.getloadavg()[0]],
                       "pct_execs": pct_execs(fleet) - execs,
                       "ssh_connections": sum(c.connections for c in counts),
                       "ssh_channels": sum(c.channels for c in counts)})


def apply(fleet: Bed, name: str, rundir: Path, repo_url: str, forks: int) -> Row:
    state = rundir / f"state-{name}"
    row = _cli(fleet, name, ["apply", PLAYBOOK, "-i", "inventory.yaml", "--var", f"cuda_repo_base={repo_url}",
                             "--state-dir", str(state), "--json", f"--forks={forks}"], rundir)
    row.scripts = sum(len(runs) for runs in recorded_scripts(state).values())
    return row


def floor(fleet: Bed, name: str, state: Path, rundir: Path, forks: int, channels: int) -> Row:
    plan = floor_plan(fleet, recorded_scripts(state))
    plan_path = rundir / f"{name}.json"
    plan_path.write_text(json.dumps(plan))
    argv = [sys.executable, "-m", "benchmarks.apply_floor", "--drive", str(plan_path),
            f"--forks={forks}", f"--channels={channels}"]
    load, execs = os.getloadavg()[0], pct_execs(fleet)
    run = measure(argv, env=_python_env(), cwd=REPO, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{name}: exit {run.returncode}: {run.stderr[-2000:]}")
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if out["mismatches"]:
        raise RuntimeError(f"{name}: the floor did other work than the record: {out['mismatches'][:5]}")
    targets = sum(len(node["containers"]) for node in plan["nodes"].values())
    driver = float(out["driver_cpu_s"])
    return Row(name, targets, targets, run.wall_s, driver, run.maxrss_kib, node_cpu_s=run.cpu_s - driver,
               scripts=int(out["scripts"]),
               detail={"facts_s": out["facts_s"], "loadavg_before_after": [load, os.getloadavg()[0]],
                       "pct_execs": pct_execs(fleet) - execs})


def remake_problem_case(fleet: Bed) -> None:
    from tests.e2e.scenarios import problem_case

    for node in fleet.nodes:
        for ctid in node.ctids:
            fleet.lab.remove_container(node.name, ctid)
            fleet.lab.add_container(node.name, ctid, setup=problem_case)


def measure_apply(fleet: Bed, repo_url: str, *, forks: int = DEFAULT_FORKS,
                  channels: int = DEFAULT_CHANNELS, floors: bool = True) -> list[Row]:
    """The five runs on a bed whose containers are the problem case (see the module's docstring); without
    floors, the first three."""
    rundir = write_cli_inventory(fleet, fleet.nodes, fleet.workdir / "apply")
    (rundir / "playbooks").mkdir(exist_ok=True)
    shutil.copy(REPO / PLAYBOOK, rundir / PLAYBOOK)
    rows = [apply(fleet, "apply-change", rundir, repo_url, forks)]
    rows.append(apply(fleet, "apply-noop", rundir, repo_url, forks))
    rows.append(_cli(fleet, "probe", ["probe", "-i", "inventory.yaml", "--json", f"--forks={forks}"], rundir))
    if not floors:
        return rows
    rows.append(floor(fleet, "floor-noop", rundir / "state-apply-noop", rundir, forks, channels))
    remake_problem_case(fleet)
    rows.append(floor(fleet, "floor-change", rundir / "state-apply-change", rundir, forks, channels))
    return rows


def ratios(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    by = {row.run: row for row in rows}

    def ratio(a: str, b: str) -> dict[str, float]:
        return {"wall": round(by[a].wall_s / by[b].wall_s, 2),
                "cpu": round(by[a].cpu_s / max(by[b].cpu_s, 1e-3), 2)}

    wanted = {"apply-change / floor-change (target <= 1.15 wall)": ("apply-change", "floor-change"),
              "apply-noop / probe (target <= 1.5 wall)": ("apply-noop", "probe"),
              "apply-noop / floor-noop": ("apply-noop", "floor-noop")}
    return {name: ratio(a, b) for name, (a, b) in wanted.items() if a in by and b in by}


def render(rows: Sequence[Row], *, nodes: int, cts: int, rtt_ms: float) -> str:
    lines = [f"apply's floor: {nodes} nodes x {cts} CTs, RTT +{rtt_ms:g} ms, {os.cpu_count()} CPUs",
             f"{'run':<14}{'ok':>9}{'scripts':>9}{'wall s':>9}{'ctl CPU s':>11}{'CPU/target ms':>15}"
             f"{'node CPU s':>12}{'RSS MiB':>9}{'pct execs':>10}{'SSH ch':>8}{'load':>12}"]
    for row in rows:
        node_cpu = f"{row.node_cpu_s:.2f}" if row.node_cpu_s is not None else "-"
        load = "/".join(f"{v:.1f}" for v in row.detail.get("loadavg_before_after", []))
        lines.append(f"{row.run:<14}{f'{row.ok}/{row.targets}':>9}{row.scripts:>9}{row.wall_s:>9.2f}"
                     f"{row.cpu_s:>11.2f}{row.cpu_ms_per_target:>15.1f}{node_cpu:>12}"
                     f"{row.maxrss_kib / 1024:>9.1f}{row.detail.get('pct_execs', 0):>10}"
                     f"{row.detail.get('ssh_channels', '-'):>8}{load:>12}")
    lines.append("ratios (wall, controller CPU):")
    for name, value in ratios(rows).items():
        lines.append(f"  {name}: wall {value['wall']:.2f}x, CPU {value['cpu']:.2f}x")
    return "\n".join(lines)


def run_bed(work: Path, nodes: int, cts: int, rtt_ms: float, *, forks: int = DEFAULT_FORKS,
            channels: int = DEFAULT_CHANNELS, repo_url: str | None = None, floors: bool = True) -> list[Row]:
    """repo_url: an apt repository stand-in already served (the e2e tests' session one), else one is
    built and served for this run."""
    from tests.e2e.scenarios import problem_case
    from tests.lab.aptrepo import build_repo, serve_repo

    repo = serve_repo(build_repo(work / "aptrepo")) if repo_url is None else None
    fleet = start_fleet(work / "bed", nodes, cts, rtt_ms)
    try:
        for node in fleet.nodes:
            for ctid in node.ctids:
                problem_case(fleet.lab.nodes[node.name].container(ctid))
        url = repo.base_url if repo is not None else repo_url
        assert url is not None
        return measure_apply(fleet, url, forks=forks, channels=channels, floors=floors)
    finally:
        fleet.close()
        if repo is not None:
            repo.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cts", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--forks", type=int, default=DEFAULT_FORKS)
    parser.add_argument("--channels", type=int, default=DEFAULT_CHANNELS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-floor", action="store_true",
                        help="only fleetfix's runs (the two applies and the probe): apply-noop / probe")
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)  # the floor driver's own process
    options = parser.parse_args(argv)
    if options.drive:
        print(json.dumps(drive(json.loads(options.drive.read_text()), options.forks, options.channels)))
        return 0
    compile_fleetfix()
    work = Path(tempfile.mkdtemp(prefix="fleetfix-apply-floor-"))
    try:
        rows = run_bed(work, options.nodes, options.cts, options.rtt_ms, forks=options.forks,
                       channels=options.channels, floors=not options.no_floor)
    finally:
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(render(rows, nodes=options.nodes, cts=options.cts, rtt_ms=options.rtt_ms))
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps({
            "nodes": options.nodes, "cts": options.cts, "rtt_ms": options.rtt_ms, "cpus": os.cpu_count(),
            "rows": [asdict(row) for row in rows], "ratios": ratios(rows)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
