"""The node's side of a batched probe (guests/pctbatch.pl): CPU per container of the driver and everything
it starts, for the real probe script as the input, against another version of the driver in the same run.

    python -m benchmarks.batch_driver [--containers 100] [--rounds 5] [--against REV]

The driver runs here as the node would run it, with a `pct` stand-in that execs the container's argv in
place (the same argv a real probe gives `pct exec`: `env -i`, the watchdog, then the reader). Ids are fed as
the fleet feeds them, at most 8 in flight (fleet.DEFAULT_CHANNELS_PER_NODE). The readers: `wc -c` (the
input read whole: the delivery alone, and each frame checked to have got every byte), `dash -n` and
`bash -n` (the script read and parsed as a container's /bin/sh would, without running it; Debian's sh is
dash, RHEL's is bash). CPU is `os.wait4`'s for the driver: its own and that of every process it reaped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from fleetfix.fleet import DEFAULT_CHANNELS_PER_NODE
from fleetfix.guests.lxc import container_argv
from fleetfix.guests.pctbatch import driver
from fleetfix.probe.run import with_buffered_stdout
from fleetfix.probe.script import build_probe_script

PCT = '#!/bin/sh\nshift 3\nexec "$@"\n'  # pct exec ID -- ARGV...: ARGV, here
READERS: dict[str, tuple[str, ...]] = {
    "wc": ("wc", "-c"),
    "dash": ("/bin/dash", "-n"),
    "bash": ("/bin/bash", "-n"),
}
_HEADER = re.compile(rb"fleetfix-batch (\d+) (-?\d+) (\d+) (\d+) (\d+)\n")


def read_frame(stream: IO[bytes]) -> tuple[int, int, bytes, bytes]:
    header = stream.readline()
    match = _HEADER.fullmatch(header)
    if match is None:
        raise RuntimeError(f"not a frame: {header[:200]!r}")
    ctid, exit_code, out_len, err_len, _ = (int(group) for group in match.groups())
    return ctid, exit_code, stream.read(out_len), stream.read(err_len)


def run_once(source: str, reader: Sequence[str], script: str, containers: int, bin_dir: Path) -> float:
    """CPU seconds of one batch of `containers`, each frame checked."""
    argv = ["perl", "-e", source, "--", "60", str(1 << 20), script, "", *container_argv(reader, 30)]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert process.stdin is not None and process.stdout is not None
    ids = iter(range(100, 100 + containers))
    for _, ctid in zip(range(DEFAULT_CHANNELS_PER_NODE), ids, strict=False):  # the first in flight
        process.stdin.write(f"{ctid}\n".encode())
    process.stdin.flush()
    done = 0
    while done < containers:
        ctid, exit_code, stdout, stderr = read_frame(process.stdout)
        done += 1
        if exit_code != 0 or (reader[0] == "wc" and stdout.strip() != str(len(script.encode())).encode()):
            raise RuntimeError(f"container {ctid}: exit {exit_code}, {stdout[:100]!r} {stderr[:300]!r}")
        following = next(ids, None)
        if following is not None:
            process.stdin.write(f"{following}\n".encode())
            process.stdin.flush()
    process.stdin.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stdout.close()
    if process.returncode != 0:
        raise RuntimeError(f"driver exit {process.returncode}")
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also the driver of this git revision, interleaved")
    parser.add_argument("--readers", default="wc,dash,bash", help="comma-separated: " + ",".join(READERS))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    drivers = {"current": driver()}
    if args.against:
        drivers[args.against] = subprocess.run(
            ["git", "show", f"{args.against}:fleetfix/guests/pctbatch.pl"], check=True, capture_output=True,
            text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    readers = [name for name in args.readers.split(",") if name]
    missing = [name for name in readers if name not in READERS or not shutil.which(READERS[name][0])]
    if missing:
        parser.error(f"no such reader here: {', '.join(missing)}")
    script = with_buffered_stdout(build_probe_script())
    samples: dict[str, dict[str, list[float]]] = {r: {d: [] for d in drivers} for r in readers}
    with tempfile.TemporaryDirectory(prefix="fleetfix-batch-bench-") as work:
        bin_dir = Path(work)
        (bin_dir / "pct").write_text(PCT)
        (bin_dir / "pct").chmod(0o755)
        started = time.monotonic()
        for _ in range(args.rounds):
            for reader in readers:
                for name, source in drivers.items():
                    cpu = run_once(source, READERS[reader], script, args.containers, bin_dir)
                    samples[reader][name].append(cpu / args.containers * 1000)
    print(f"{args.containers} containers, {args.rounds} rounds, input {len(script.encode())} bytes, "
          f"{time.monotonic() - started:.0f} s; CPU per container (ms), median [min-max]:")
    for reader in readers:
        cells = [f"{name} {statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"
                 for name, values in samples[reader].items()]
        print(f"  {reader:5} " + "   ".join(cells))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"containers": args.containers, "input_bytes": len(script.encode()),
                                         "ms_per_container": samples}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
