"""The fleet benchmark's harness, kept alive in CI: 3 nodes x 3 containers behind the latency proxy.

Asserts what each tool did on the wire, from the nodes' sshd logs, never how long it took: fleetfix opens
exactly one TCP connection per node and one channel per node, which runs its containers and its node facts
(guests/pctbatch.py); the OpenSSH floor, one ControlMaster per node, does the same work with one exec channel
per container plus one for the node facts. Ansible is not run here.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.fleet_probe import Bed, compare, run_fleetfix, start_fleet
from benchmarks.instructions import VALGRIND, measure_instructions, render
from benchmarks.latency_proxy import require_loopback
from benchmarks.measure import SshCounts
from tests.conftest import in_ci

NODES, CTS = 3, 3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    fleet = start_fleet(tmp_path_factory.mktemp("bench"), NODES, CTS, rtt_ms=20, log=False)
    yield fleet
    fleet.close()


def test_the_bed_is_loopback_only_and_every_node_has_its_own_proxy(bed: Bed) -> None:
    assert len(bed.nodes) == NODES
    for node in bed.nodes:
        require_loopback(node.address)
        assert node.proxy_port is not None and node.proxy_port != node.port
        with socket.create_connection((node.address, node.proxy_port), timeout=5) as sock:
            assert sock.recv(4).startswith(b"SSH-")  # the proxy relays the node's sshd banner


def test_every_tool_uses_one_connection_per_node_and_the_channels_it_should(bed: Bed) -> None:
    # One channel per container plus the node's facts; fleetfix runs a node's containers and its facts
    # over one channel (guests/pctbatch.py).
    tools = ["fleetfix", "floor", "fleetfix-cli", "paramiko-ref"]
    results = {r.tool: r for r in compare(bed, tools=tools, forks=32, channels=8)}
    for tool in tools:
        channels = 1 if tool.startswith("fleetfix") else CTS + 1
        result = results[tool]
        assert (result.ok, result.targets) == (NODES * CTS, NODES * CTS), result.detail
        assert result.per_node == {node.name: SshCounts(connections=1, channels=channels)
                                   for node in bed.nodes}, tool
        assert (result.connections, result.channels) == (NODES, NODES * channels)
        assert result.cpu_s > 0 and result.maxrss_kib > 0  # measured, not asserted against a target
    assert results["fleetfix"].detail["with_node_facts"] == NODES * CTS


def test_a_subset_is_counted_on_its_own_nodes_only(bed: Bed) -> None:
    result = run_fleetfix(bed, bed.subset(1, 2))
    assert result.ok == result.targets == 2
    assert result.per_node == {bed.nodes[0].name: SshCounts(connections=1, channels=1)}  # the batch


def test_the_work_directory_holds_the_scripts_every_tool_runs(bed: Bed) -> None:
    from fleetfix.probe import build_node_script, build_probe_script

    assert Path(bed.probe_script).read_text() == build_probe_script()
    assert Path(bed.node_script).read_text() == build_node_script()


def test_scale_mode_audits_cheap_containers_through_the_real_command(tmp_path: Path) -> None:
    """benchmarks/scale.py on 12 targets (two nodes of the bed's 100-CT layout would be 200: the step
    takes what it needs): the audit recorded every target, the bed's stopped ones as unreachable, and the
    timers and sizes came back. Nothing about how long it took."""
    import sqlite3

    from benchmarks.scale import PER_NODE, run_step, start_bed

    lab = start_bed(tmp_path, 1, seed=21)
    try:
        [first, second] = run_step(lab, 12, 2, tmp_path)
    finally:
        lab.close()
    assert PER_NODE >= 12 and (first["targets"], second["night"]) == (12, 2)
    assert first["summary"].startswith("12 target(s):")
    assert second["db_bytes"] > 0 and second["html_bytes"] > 0 and second["cpu_s"] > 0
    db = tmp_path / "step-12" / "audit.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM target_results").fetchone()[0] == 24
        assert conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'complete'").fetchone()[0] == 2


def test_instruction_counts_split_the_command_into_start_up_imports_and_work(bed: Bed) -> None:
    """benchmarks/instructions.py under valgrind on this bed: each part counted, the parts in the order
    they contain one another, both whole runs probing every target (checked inside). Skips without
    valgrind, except under CI=true (.ci/run installs it). How many instructions is not asserted."""
    if shutil.which(VALGRIND) is None:
        if in_ci():
            pytest.fail("CI=true and valgrind is not installed", pytrace=False)
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    # Two runs at once: the counts are per process, so this only halves the wall time on CI's two cores.
    counts = measure_instructions(bed, bed.subset(2, 2), jobs=2)
    assert counts.targets == 4
    assert 0 < counts.startup < counts.imports_others < counts.imports_all
    assert counts.imports_fleetfix > 0 and counts.after_imports > 0  # the run does more than import
    assert len(counts.probe) == len(counts.reference) == 1 and counts.reference[0] > counts.startup
    assert "fleetfix probe / paramiko reference" in render(counts, nodes=2, cts=2, rtt_ms=bed.rtt_ms)
