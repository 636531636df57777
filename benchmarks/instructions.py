"""Instructions, not seconds: where `fleetfix probe`'s controller work goes, counted by callgrind.

    python -m benchmarks.instructions --nodes 20 --cts 10 --rtt-ms 20

Why: on this machine the CPU seconds of one and the same run move by 25-40% within an hour (docs/
performance.md), so a change worth 1% can only be seen in dozens of interleaved runs. The instructions a
process executes in user space do not move: the 200-target probe counted 1,789,990,819 and 1,790,454,394
(0.03% apart). So a change to start-up or to per-target work is measured here once, exactly.

On one bed (benchmarks.fleet_probe.start_fleet), each under `valgrind --tool=callgrind`:
- start-up: `python -c pass`;
- imports: the modules `fleetfix probe` had loaded when it exited (recorded from a plain run of the same
  command), imported in that order and nothing else run: first the standard library's and third parties'
  alone, then with fleetfix's own (the difference is fleetfix's modules, its pydantic models included);
- `fleetfix probe -i inventory.yaml --json`, whole: what is not imports is the work per node and target;
- the minimal paramiko reference (benchmarks/paramiko_ref.py), whole.

What it does not count: the kernel's share (system calls, page faults, context switches: ~20% of the
command's CPU seconds here, more of the reference's), nor what an instruction costs (cache misses, waiting
for the interpreter lock). CPU seconds stay the targets' measure (benchmarks.fleet_probe); this says what
they are made of. Needs valgrind (`apt-get install valgrind`); a run is 20-50x slower than without it.
Once in six 20-node runs the reference's connection to a node closed mid-run under valgrind (EOFError;
the cause not found): the run fails with its traceback, and is run again.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.fleet_probe import (
    DEFAULT_CHANNELS,
    DEFAULT_FORKS,
    REPO,
    Bed,
    NodeSpec,
    _python_env,
    start_fleet,
    write_cli_inventory,
    write_ref_spec,
)
from benchmarks.measure import compile_fleetfix
from fleetfix.errors import ExitCode

VALGRIND = "valgrind"
_COLLECTED = re.compile(r"^==\d+== Collected : (\d+)$", re.MULTILINE)

# Runs `fleetfix` as `python -m fleetfix` does and writes the names in sys.modules, in the order they were
# loaded, when the process exits.
RECORDER = """\
import atexit, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(list(sys.modules))))
sys.argv = ["fleetfix", *sys.argv[2:]]
runpy.run_module("fleetfix", run_name="__main__", alter_sys=True)
"""

# Imports the modules named in the first JSON list, in order, and no module the command never had (the
# second list): what it went without stays out here too, e.g. paramiko's optional `invoke`, which fleetfix
# hides (transport/_paramiko.py). A module that cannot be imported on its own is passed over. The collector
# runs as the command's start-up has it (fleetfix/cli/collector.py: a collection per 100,000 new objects,
# everything frozen at exit), so that what start-up costs in the command is what it costs here.
IMPORTER = """\
import atexit, gc, importlib, json, sys
gc.set_threshold(100_000, *gc.get_threshold()[1:])
atexit.register(gc.freeze)
names, had = json.load(open(sys.argv[1])), set(json.load(open(sys.argv[2])))
class NeverLoaded:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in had:
            raise ModuleNotFoundError(f"the command never loaded {name}", name=name)
sys.meta_path.insert(0, NeverLoaded)
for name in names:
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""


@dataclass
class Breakdown:
    """Instructions executed in user space, by part; `probe` and `reference` once per repeat."""

    targets: int
    startup: int
    imports_others: int  # the standard library's and third parties' modules the command loads
    imports_all: int  # ... and fleetfix's own
    probe: list[int]
    reference: list[int]

    @property
    def imports_fleetfix(self) -> int:
        return self.imports_all - self.imports_others

    @property
    def after_imports(self) -> int:
        """The command's work once everything it loads is loaded: per node and per target."""
        return min(self.probe) - self.imports_all

    @property
    def ratio(self) -> float:
        return min(self.probe) / min(self.reference)


def collected(log: str) -> int:
    """The count in callgrind's log (`==PID== Collected : N`); ValueError unless there is exactly one (a
    process that forked would report one per process)."""
    counts = _COLLECTED.findall(log)
    if len(counts) != 1:
        raise ValueError(f"expected one 'Collected' line in callgrind's log, found {len(counts)}")
    return int(counts[0])


def count_instructions(argv: Sequence[str], *, cwd: Path, exits: Collection[int] = (0,),
                       timeout: float = 3600.0) -> tuple[int, subprocess.CompletedProcess[str]]:
    """argv run to completion under callgrind: the instructions it executed, and how it ended (its own
    stdout and stderr: valgrind's messages go to a log file). RuntimeError if it exited otherwise than
    `exits` allow."""
    with tempfile.TemporaryDirectory(prefix="callgrind-") as scratch:
        log = Path(scratch) / "valgrind.log"
        done = subprocess.run(
            [VALGRIND, "--tool=callgrind", "--callgrind-out-file=/dev/null", f"--log-file={log}", *argv],
            cwd=cwd, env=_python_env(), capture_output=True, text=True, timeout=timeout, check=False,
        )
        if done.returncode not in exits:
            raise RuntimeError(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
        return collected(log.read_text()), done


def split_modules(loaded: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the others' modules, every module) in load order, fleetfix's last in the second; never `__main__`
    (the command itself) nor fleetfix.__main__, whose import runs the command."""
    names = [name for name in loaded if name not in ("__main__", "__mp_main__")
             and name != "fleetfix.__main__"]
    own = [name for name in names if name == "fleetfix" or name.startswith("fleetfix.")]
    mine = set(own)
    others = [name for name in names if name not in mine]
    return others, others + own


def probe_argv(forks: int) -> list[str]:
    return ["probe", "-i", "inventory.yaml", "--json", f"--forks={forks}"]


# The probe's exit codes for a run that probed every target: healthy, or findings of error severity (a bed
# may be built broken); unreachable targets are refused by _checked_probe.
PROBED = (ExitCode.OK, ExitCode.FINDINGS)


def _checked_probe(done: subprocess.CompletedProcess[str], targets: int) -> None:
    reports = json.loads(done.stdout)["targets"]
    ok = sum(report["status"] == "ok" for report in reports)
    if (len(reports), ok) != (targets, targets):
        raise RuntimeError(f"fleetfix probe: {ok} of {len(reports)} targets ok, expected {targets}")


def _checked_reference(done: subprocess.CompletedProcess[str], targets: int) -> None:
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    if (summary["targets"], summary["ok"]) != (targets, targets):
        raise RuntimeError(f"paramiko reference: {summary['ok']} of {summary['targets']} targets ok")


def measure_instructions(fleet: Bed, nodes: Sequence[NodeSpec], *, forks: int = DEFAULT_FORKS,
                         channels: int = DEFAULT_CHANNELS, repeat: int = 1, jobs: int = 1) -> Breakdown:
    """Each part counted under callgrind. jobs: how many of those runs go at once. A count is the
    instructions of its own process, so it does not depend on jobs; only the wall time does (the smoke
    test in CI runs two at once on its two cores)."""
    targets = sum(len(node.ctids) for node in nodes)
    rundir = write_cli_inventory(fleet, nodes, fleet.workdir / "instructions")
    spec = write_ref_spec(fleet, nodes, forks=forks, channels=channels)
    python = sys.executable

    record = rundir / "loaded.json"
    recorded = subprocess.run([python, "-c", RECORDER, str(record), *probe_argv(forks)], cwd=rundir,
                              env=_python_env(), capture_output=True, text=True, timeout=600, check=False)
    if recorded.returncode not in PROBED:
        raise RuntimeError(f"fleetfix probe exited {recorded.returncode}: {recorded.stderr[-2000:]}")
    others, every = split_modules(json.loads(record.read_text()))
    others_file, every_file = rundir / "imports-others.json", rundir / "imports-all.json"
    others_file.write_text(json.dumps(others))
    every_file.write_text(json.dumps(every))

    importer = [python, "-c", IMPORTER]

    def probe_count() -> int:
        count, done = count_instructions([python, "-m", "fleetfix", *probe_argv(forks)], cwd=rundir,
                                         exits=PROBED)
        _checked_probe(done, targets)
        return count

    def reference_count() -> int:
        count, done = count_instructions([python, "-m", "benchmarks.paramiko_ref", str(spec)], cwd=REPO)
        _checked_reference(done, targets)
        return count

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        startup = pool.submit(lambda: count_instructions([python, "-c", "pass"], cwd=rundir)[0])
        imports_others = pool.submit(
            lambda: count_instructions([*importer, str(others_file), str(every_file)], cwd=rundir)[0])
        imports_all = pool.submit(
            lambda: count_instructions([*importer, str(every_file), str(every_file)], cwd=rundir)[0])
        runs = [(pool.submit(probe_count), pool.submit(reference_count))  # interleaved, as
                for _ in range(repeat)]                                   # benchmarks.fleet_probe runs them
        return Breakdown(targets, startup.result(), imports_others.result(), imports_all.result(),
                         [probe.result() for probe, _ in runs], [reference.result() for _, reference in runs])


def render(result: Breakdown, *, nodes: int, cts: int, rtt_ms: float) -> str:
    def row(label: str, count: int, *, per_target: bool = False) -> str:
        each = f"{count / result.targets / 1e6:10.2f}" if per_target else ""
        return f"{label:<46}{count / 1e6:10.1f}{each}"

    lines = [
        f"{nodes} nodes x {cts} CTs = {result.targets} targets, +{rtt_ms:g} ms RTT; instructions in user "
        "space (callgrind), millions",
        f"{'':<46}{'total':>10}{'/target':>10}",
        row("python start-up (python -c pass)", result.startup),
        row("imports: standard library and third parties", result.imports_others - result.startup),
        row("imports: fleetfix's modules", result.imports_fleetfix),
        row("fleetfix probe, whole", min(result.probe), per_target=True),
        row("  of which after its imports", result.after_imports, per_target=True),
        row("paramiko reference, whole", min(result.reference), per_target=True),
        f"fleetfix probe / paramiko reference: {result.ratio:.2f}x",
    ]
    if len(result.probe) > 1:
        lines.append(f"runs: fleetfix probe {result.probe}, reference {result.reference}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--cts", type=int, default=10, help="containers per node")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="added round-trip time (0: no proxy)")
    parser.add_argument("--forks", type=int, default=DEFAULT_FORKS)
    parser.add_argument("--channels", type=int, default=DEFAULT_CHANNELS, help="the reference's per node")
    parser.add_argument("--repeat", type=int, default=1, help="count the command and the reference N times")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args(argv)
    if shutil.which(VALGRIND) is None:
        print("benchmarks.instructions needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    compile_fleetfix()
    workdir = Path(tempfile.mkdtemp(prefix="fleetfix-instructions-"))
    try:
        fleet = start_fleet(workdir, args.nodes, args.cts, args.rtt_ms)
        try:
            result = measure_instructions(fleet, fleet.nodes, forks=args.forks, channels=args.channels,
                                          repeat=args.repeat)
        finally:
            fleet.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(result, nodes=args.nodes, cts=args.cts, rtt_ms=args.rtt_ms))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"nodes": args.nodes, "cts": args.cts, "rtt_ms": args.rtt_ms,
                                         **asdict(result), "ratio": result.ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
