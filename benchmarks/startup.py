"""`fleetfix --help` start-up time against `python -c pass`, measured in the same run.

    python -m benchmarks.startup [--runs 20]

Uses hyperfine when it is installed (`apt-get install hyperfine`), else a plain loop (median and mean of
--runs, after 3 warm-up runs). The interpreter is the real one (sys.executable), not a pyenv shim, and the
console script is the one installed next to it, so only Python's and fleetfix's own start-up are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.measure import compile_fleetfix

REPO = Path(__file__).resolve().parents[1]
WARMUP = 3


def commands() -> dict[str, list[str]]:
    python = sys.executable
    found = {
        "python -c pass": [python, "-c", "pass"],
        "python -m fleetfix --help": [python, "-m", "fleetfix", "--help"],
    }
    script = Path(python).parent / "fleetfix"
    if script.exists():
        found["fleetfix --help"] = [str(script), "--help"]
    return found


def with_loop(runs: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for name, argv in commands().items():
        times = []
        for index in range(WARMUP + runs):
            started = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=REPO)
            if index >= WARMUP:
                times.append(time.perf_counter() - started)
        results[name] = {"median_s": statistics.median(times), "mean_s": statistics.fmean(times),
                         "min_s": min(times), "runs": len(times)}
    return results


def with_hyperfine(hyperfine: str, runs: int) -> dict[str, dict[str, float]]:
    named = commands()
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "hyperfine.json"
        argv = [hyperfine, "-N", "--warmup", str(WARMUP), "--runs", str(runs), "--export-json", str(export),
                "--style", "none"]
        for name, command in named.items():
            argv += ["-n", name, " ".join(command)]
        subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        data = json.loads(export.read_text())
    return {
        entry["command"]: {"median_s": entry["median"], "mean_s": entry["mean"], "min_s": entry["min"],
                           "runs": len(entry["times"])}
        for entry in data["results"]
    }


def measure_startup(runs: int = 20) -> dict[str, object]:
    hyperfine = shutil.which("hyperfine")
    results = with_hyperfine(hyperfine, runs) if hyperfine else with_loop(runs)
    return {"tool": "hyperfine" if hyperfine else "loop", "loadavg": os.getloadavg(), "results": results}


def render(report: dict[str, object]) -> str:
    results = report["results"]
    assert isinstance(results, dict)
    baseline = results["python -c pass"]["median_s"]
    lines = [f"start-up ({report['tool']}, load average {report['loadavg'][0]:.2f})"]  # type: ignore[index]
    for name, row in results.items():
        lines.append(
            f"{name:<28}median {row['median_s'] * 1000:7.1f} ms   mean {row['mean_s'] * 1000:7.1f} ms"
            f"   min {row['min_s'] * 1000:7.1f} ms"
            f"   (+{(row['median_s'] - baseline) * 1000:.0f} ms over python)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    compile_fleetfix()
    report = measure_startup(args.runs)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
