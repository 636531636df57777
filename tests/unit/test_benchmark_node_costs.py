"""benchmarks/node_costs.py kept alive: both ways of looking a fleet up in known_hosts find every node, in
plain and hashed files, and the key is loaded. What it measures (CPU per node) is not asserted here."""

from __future__ import annotations

import pytest

from benchmarks import node_costs
from fleetfix.transport.hostkeys import KnownHosts, known_hosts_name
from fleetfix.transport.ssh import PASSPHRASE_ENV


def test_the_benchmark_runs_both_ways_on_a_small_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSPHRASE_ENV, "")  # restored after: the benchmark sets its own
    report = node_costs.run([3, 12])
    assert [(row["nodes"], row["hashed"]) for row in report["known_hosts"]] == [
        (3, False), (3, True), (12, False), (12, True)]
    assert all(row["sampled_nodes"] == row["nodes"] for row in report["known_hosts"])  # few: all of them
    assert [row["nodes"] for row in report["identity_key"]] == [3, 12]
    assert "known_hosts hashed" in node_costs.render(report)


def test_the_old_lookup_it_compares_with_finds_what_the_new_one_finds(tmp_path_factory: pytest.TempPathFactory
                                                                      ) -> None:
    work = tmp_path_factory.mktemp("kh")
    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C7okWi0dh2l6GKv0"
    for hashed in (False, True):
        path = work / f"known_hosts-{hashed}"
        node_costs.write_known_hosts(path, 30, line, hashed=hashed)
        for index in (0, 7, 29):
            address, port = node_costs.node_address(index)
            new = KnownHosts(str(path)).entries_for(address, port)
            old = node_costs.old_entries_for(path, known_hosts_name(address, port))
            assert new == old and len(new) == 1
