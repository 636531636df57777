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
from tests.lab.aptrepo import AptRepo

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


def test_apply_floor_runs_apply_the_floor_and_the_probe_on_one_bed(tmp_path: Path, apt_repo: AptRepo) -> None:
    """benchmarks/apply_floor.py on 1 node x 2 problem-case containers: both applies fixed every target,
    the floor ran exactly the recorded scripts (their exit statuses checked inside) through as many
    `pct exec` calls as fleetfix made, and the ratios came back. How long anything took is not asserted."""
    from benchmarks.apply_floor import ratios, render, run_bed

    rows = {row.run: row for row in run_bed(tmp_path, 1, 2, 0, repo_url=apt_repo.base_url)}
    assert list(rows) == ["apply-change", "apply-noop", "probe", "floor-noop", "floor-change"]
    for row in rows.values():
        assert (row.ok, row.targets) == (2, 2), row
        assert row.wall_s > 0 and row.cpu_s > 0 and row.maxrss_kib > 0
    assert rows["apply-change"].detail["statuses"] == ["changed"]
    assert rows["apply-noop"].detail["statuses"] == ["ok"]
    for kind in ("change", "noop"):
        apply, floor = rows[f"apply-{kind}"], rows[f"floor-{kind}"]
        assert floor.scripts == apply.scripts > 0
        assert floor.detail["pct_execs"] == apply.detail["pct_execs"]  # the same scripts, plus the facts
        assert floor.node_cpu_s is not None and floor.node_cpu_s > 0
        assert apply.node_cpu_s is not None and apply.node_cpu_s > 0  # what the node's sshd reaped
    assert rows["apply-noop"].scripts < rows["apply-change"].scripts
    assert set(ratios(list(rows.values()))) == {"apply-change / floor-change (target <= 1.15 wall)",
                                                 "apply-noop / probe (target <= 1.5 wall)",
                                                 "apply-noop / floor-noop"}
    assert "ratios (wall, controller CPU):" in render(list(rows.values()), nodes=1, cts=2, rtt_ms=0)


def test_thousand_nodes_mode_gives_every_node_its_own_address_and_host_key_entry(tmp_path: Path) -> None:
    """benchmarks/thousand_nodes.py on 6 nodes x 2 containers: one sshd configuration behind six loopback
    addresses, each connection authenticated by its own `sshd -i`, fleetfix and the paramiko reference
    probing every target under a 1024-descriptor limit, threads and descriptors sampled. A wrong host key
    for one address fails that node alone: the check is per address."""
    from benchmarks.thousand_nodes import ManyAddressSshd, render, run_tool
    from tests.lab.sshd import keygen

    bed = ManyAddressSshd(tmp_path, 6, 2)
    try:
        assert len(set(bed.addresses)) == 6 and all(a.startswith("127.1.") for a in bed.addresses)
        runs = [run_tool(bed, tool, 2, 4, tmp_path, nofile=1024, connect_timeout=30)
                for tool in ("fleetfix", "paramiko")]
        for run in runs:
            assert (run.ok, run.targets) == (12, 12), run
            assert run.returncode in (0, 3, 4), run  # probe: 3 and 4 say what the recorded outputs hold
            assert run.connections == 6 and run.nofile == 1024
            assert run.cpu_s > 0 and run.maxrss_kib > 0 and run.peak_threads > 0 and run.peak_fds > 0
        assert "fleetfix / paramiko reference CPU per node" in render(runs)
        lines = bed.known_hosts(tmp_path / "known_hosts").read_text().splitlines()
        other_key = " ".join(keygen(tmp_path / "other_key", "other").split()[:2])
        lines[0] = f"{lines[0].split()[0]} {other_key}"  # the first node's entry: another key

        def wrong_first_key(path: Path) -> Path:
            path.write_text("\n".join(lines) + "\n")
            return path

        bed.known_hosts = wrong_first_key  # type: ignore[method-assign]
        [checked] = [run_tool(bed, "fleetfix", 2, 4, tmp_path, nofile=1024, connect_timeout=30)]
        assert checked.ok == 10, checked
        assert f"REMOTE HOST IDENTIFICATION HAS CHANGED for [{bed.addresses[0]}]:{bed.port}" in checked.error
    finally:
        bed.close()


def test_a_probe_of_more_nodes_than_forks_holds_forks_plus_spare_connections(tmp_path: Path) -> None:
    """benchmarks/thousand_nodes.py's bed, 24 nodes x 2 containers, probed in this process at forks 2 with
    dial-ahead: every target probed, each node connected once, and sampled throughout, never more than
    2 x forks paramiko transports open (a thread each), and the process's threads in use bounded by forks,
    not by the nodes: each node's connection closes once its targets are done."""
    import threading

    import paramiko

    from benchmarks.thousand_nodes import FIRST_CTID, ManyAddressSshd
    from fleetfix.fleet import Fleet
    from fleetfix.probe.run import probe_targets
    from fleetfix.target import GuestRef, NodeRef, SSHSettings, Target

    nodes, forks = 24, 2
    bed = ManyAddressSshd(tmp_path, nodes, 2)
    try:
        known_hosts = str(bed.known_hosts(tmp_path / "known_hosts"))
        targets = []
        for index, address in enumerate(bed.addresses):
            settings = SSHSettings(address, bed.port, identity_file=str(bed.lab.client_key),
                                   known_hosts=known_hosts, connect_timeout=30)
            node = NodeRef(f"n{index:02d}", settings)
            targets += [Target(f"n{index:02d}/{ctid}", node, GuestRef.lxc(ctid))
                        for ctid in (FIRST_CTID, FIRST_CTID + 1)]
        peaks = {"transports": 0, "threads": 0}
        stop = threading.Event()

        def threads_in_use() -> int:
            # A closed connection's paramiko thread is on its way out (the socket's shutdown ends it), but on
            # a loaded machine (four test workers on two cores) it can linger: what the bound is about is
            # the threads the run keeps, so a Transport counts while it is active.
            return sum(1 for t in threading.enumerate()
                       if not isinstance(t, paramiko.Transport) or t.active)

        def sample() -> None:
            while not stop.is_set():
                open_now = sum(t.active for t in threading.enumerate() if isinstance(t, paramiko.Transport))
                peaks["transports"] = max(peaks["transports"], open_now)
                peaks["threads"] = max(peaks["threads"], threads_in_use())
                stop.wait(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        before = threads_in_use()  # pytest's and the bed's own, the sampler's next
        sampler.start()
        try:
            with Fleet(forks=forks) as fleet:
                fleet.start_connecting(targets)
                reports = probe_targets(fleet, targets)
        finally:
            stop.set()
            sampler.join()
        assert [report.error for report in reports] == [None] * len(targets)
        assert bed.accepted() == nodes
        assert 0 < peaks["transports"] <= 2 * forks, peaks
        # Per fork: a map worker, a dialler, its node's connection and a spare one (a paramiko thread each),
        # its node's batch, and the batches of the nodes it has just finished, still ending (two of them
        # on a loaded machine: 12-15 threads here with four busy loops beside the test); and the sampler.
        # The old code: a connection per node, 24 transports and 35 threads here.
        assert peaks["threads"] - before <= 8 * forks + 1 < nodes, (peaks, before)
    finally:
        bed.close()


def test_the_bed_serves_the_command_lines_proxmox_pct_remote_sends(bed: Bed, tmp_path: Path) -> None:
    """benchmarks/apply_ansible.py's Ansible runs go through community.proxmox.proxmox_pct_remote 1.4.0,
    which is not installed in CI (a 550 MB venv). What it sends is fixed, so it is replayed here with
    paramiko as the plugin does it: one SSH session per command, `/usr/sbin/pct exec VMID -- CMD` joined by
    spaces for the node's shell to split; put_file is `/bin/sh -c 'cat > PATH'` with the file on stdin
    (no PTY), fetch_file `/bin/sh -c 'cat PATH'`, a module run `/bin/sh -c '/usr/bin/python3 PATH && sleep
    0'` on a PTY. The project the benchmark writes points at the bed: every container, its node's proxy
    endpoint with the node's host key, and the host key is checked."""
    import shlex

    import paramiko
    import yaml

    from benchmarks.apply_ansible import playbook_vars, write_ansible_project
    from benchmarks.fleet_probe import enable_usr_sbin_pct

    values = playbook_vars({"cuda_repo_url": "http://127.0.0.1:1/compute/cuda/repos/debian12/x86_64",
                            "cuda_xy": "12.8", "cuda_packages": ["cuda-nvcc-12-8"],
                            "keyring_version": "1.1-1", "apt_lock_timeout": 600})
    project = write_ansible_project(bed, tmp_path / "ansible", 9, values)
    assert "forks = 9" in (project / "ansible.cfg").read_text()
    assert yaml.safe_load((project / "vars.yml").read_text()) == values
    hosts = [line.split() for line in (project / "inventory.ini").read_text().splitlines()
             if "proxmox_vmid=" in line]
    assert len(hosts) == NODES * CTS
    node, ctid = bed.nodes[0], bed.nodes[0].ctids[0]
    assert hosts[0] == [f"{node.name}-{ctid}", f"ansible_host={node.address}",
                        f"ansible_port={node.proxy_port}", f"proxmox_vmid={ctid}"]

    enable_usr_sbin_pct(bed)
    client = paramiko.SSHClient()
    client.load_host_keys(str(project / "home" / ".ssh" / "known_hosts"))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(node.address, port=node.proxy_port, username="root", key_filename=str(bed.lab.client_key),
                   look_for_keys=False, allow_agent=False, timeout=30)

    def pct_remote(cmd: str, *, data: bytes | None = None, pty: bool = False) -> tuple[int, bytes]:
        transport = client.get_transport()
        assert transport is not None
        channel = transport.open_session()
        if pty:
            channel.get_pty(term="vt100", width=0, height=0)
        channel.exec_command(" ".join(["/usr/sbin/pct", "exec", str(ctid), "--", cmd]))
        if data is not None:
            channel.sendall(data)
            channel.shutdown_write()
        out = b"".join(channel.makefile("rb", 4096))
        return channel.recv_exit_status(), out

    path = "/root/.ansible/tmp/ansible-tmp-1/AnsiballZ_probe.py"
    module = b'import json, sys\nprint(json.dumps({"changed": False, "argv0": sys.argv[0]}))\nsys.exit(3)\n'
    try:
        assert pct_remote("/bin/sh -c " + shlex.quote(f"mkdir -p {path.rsplit('/', 1)[0]} && sleep 0"),
                          pty=True) == (0, b"")
        assert pct_remote("/bin/sh -c " + shlex.quote(f"cat > {path}"), data=module) == (0, b"")
        assert pct_remote("/bin/sh -c " + shlex.quote(f"cat {path}")) == (0, module)
        status, out = pct_remote("/bin/sh -c " + shlex.quote(f"/usr/bin/python3 {path} && sleep 0"), pty=True)
        assert status == 3  # the module's exit status passes through the PTY path too
        assert out.replace(b"\r\n", b"\n") == b'{"changed": false, "argv0": "%s"}\n' % path.encode()
    finally:
        client.close()
    calls = bed.lab.nodes[node.name].pct_calls()
    assert ["exec", str(ctid), "--", "/bin/sh", "-c", f"cat > {path}"] in calls  # the node's shell split it
