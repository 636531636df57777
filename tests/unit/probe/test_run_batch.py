"""A node's containers are probed over one batch (guests/pctbatch.py): the real probe script and Perl driver,
this machine as the node (no SSH settings: LocalTransport) and a `pct` stand-in on PATH that records who
started it and runs the command here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fleetfix.fleet import Fleet
from fleetfix.probe import run
from fleetfix.probe.run import probe_targets
from fleetfix.target import GuestRef, NodeRef, Target
from fleetfix.transport.base import CommandResult, Transport

PCT = """#!/bin/sh
[ "$1" = exec ] || exit 2
echo "$2 $(cat /proc/$PPID/comm)" >>"{log}"
shift 3
exec "$@"
"""


@pytest.fixture
def pct_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pct.log"
    (bin_dir / "pct").write_text(PCT.format(log=log))
    (bin_dir / "pct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def containers(*ctids: int) -> list[Target]:
    node = NodeRef("pve1", None)
    return [Target(f"pve1/{ctid}", node, GuestRef.lxc(ctid)) for ctid in ctids]


def started_by(log: Path) -> dict[int, str]:
    """ctid -> the program that ran its `pct exec`."""
    if not log.exists():
        return {}
    return {int(ctid): parent for ctid, parent in (line.split() for line in log.read_text().splitlines())}


def test_a_nodes_containers_share_one_batch(pct_log: Path) -> None:
    with Fleet() as fleet:
        reports = probe_targets(fleet, containers(200, 201, 202))
    assert [report.status for report in reports] == ["ok"] * 3, [str(report.error) for report in reports]
    assert all(report.facts is not None and report.facts.os.id for report in reports)
    assert started_by(pct_log) == {200: "perl", 201: "perl", 202: "perl"}


def test_the_node_facts_come_with_the_batch(pct_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One channel per node for the whole probe: the node script runs in the batch, not on its own channel.
    own_channel: list[str] = []
    real_run_script = run.run_script

    def recording(transport: Transport, script: str, **kwargs: Any) -> CommandResult:
        own_channel.append(script)
        return real_run_script(transport, script, **kwargs)

    monkeypatch.setattr(run, "run_script", recording)
    with Fleet() as fleet:
        reports = probe_targets(fleet, containers(200, 201))
    hostname = os.uname().nodename
    assert [report.node.hostname if report.node else None for report in reports] == [hostname, hostname]
    assert own_channel == []
    assert started_by(pct_log) == {200: "perl", 201: "perl"}


def test_one_container_alone_runs_on_its_own_channel(pct_log: Path) -> None:
    with Fleet() as fleet:
        [report] = probe_targets(fleet, containers(200))
    assert report.status == "ok"
    assert started_by(pct_log)[200] != "perl"


def test_an_interrupt_starts_no_more_containers_on_the_node(pct_log: Path) -> None:
    # One target at a time; the first one's end interrupts the run: the node never starts the others.
    with Fleet(channels_per_node=1) as fleet:
        def interrupt(_target: Target) -> None:
            fleet.interrupt()

        reports = probe_targets(fleet, containers(200, 201, 202), on_probed=interrupt)
    assert [report.status for report in reports] == ["ok", "failed", "failed"]
    assert all("interrupted" in str(report.error) for report in reports[1:])
    assert started_by(pct_log) == {200: "perl"}
