"""Issue 9's fault matrix, through the real CLI on the test bed (docs/reliability.md lists each row's test).

Every row checks the same four things: the other targets still complete; the affected target ends with a
clear status and a one-line reason; the run record (apply) or audit history keeps every target; the exit
code says what happened. Rows already covered elsewhere are named in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import in_ci
from tests.e2e.conftest import REPO, CliResult, run_cli
from tests.e2e.scenarios import problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab, LabNode
from tests.lab.container import Container
from tests.lab.sshd import SshNode, free_port, keygen, start_node
from tests.waiting import LineWatcher, wait_for

EXIT_FAILED, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 1, 4, 130
CUDA_PLAYBOOK = "playbooks/cuda-toolkit.yaml"


# -- helpers --------------------------------------------------------------------------------------------


def node_entry(lab: Lab, node: str | LabNode | None = None, *, name: str | None = None,
               containers: Sequence[tuple[int, dict[str, Any]]] = (), **fields: Any) -> dict[str, Any]:
    """One `nodes:` entry for a lab node (or, with address/port in fields, for any address)."""
    target = lab.node(node) if node is not None or "address" not in fields else None
    entry: dict[str, Any] = {
        "name": name or (target.name if target else "other"),
        "identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts), "connect_timeout": 5,
    }
    if target is not None:
        entry.update(address=target.address, port=target.port)
    entry.update(fields)
    if containers:
        entry["containers"] = [{"ctid": ctid, "vars": ct_vars} for ctid, ct_vars in containers]
    return entry


def write_nodes(path: Path, nodes: Sequence[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"nodes": list(nodes)}, allow_unicode=True))
    return path


def write_playbook(path: Path, steps: Sequence[dict[str, Any]], **vars: Any) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "vars": vars, "steps": list(steps)},
                                   allow_unicode=True))
    return path


def by_target(items: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["target"]: item for item in items}


def one_line(text: str | None) -> str:
    assert text, "no reason given"
    assert "\n" not in text.strip(), f"reason is not one line: {text!r}"
    assert "Traceback" not in text
    return text


def unique() -> str:
    """A fractional sleep length no other process uses: `pgrep -f` finds exactly our command."""
    return f"{uuid.uuid4().int % 10**6:06d}"


def pids_running(marker: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) != os.getpid()]


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CLI as a child process we can signal (run_cli waits for it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fleetfix", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO, env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def finish(process: subprocess.Popen[str], timeout: float = 120) -> CliResult:
    stdout, stderr = process.communicate(timeout=timeout)
    return CliResult(process.returncode, stdout, stderr)


def runs(state: Path) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = run_cli("runs", "list", "--state-dir", str(state), "--json").json()
    return listed


def run_detail(state: Path, run_id: str) -> dict[str, Any]:
    detail: dict[str, Any] = run_cli("runs", "show", run_id, "--state-dir", str(state), "--json").json()
    return detail


def audit_history(db: Path) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = run_cli("audit", "history", "--db", str(db), "--json").json()
    return history


def committed_targets(db: Path) -> int:
    """Target results in the audit history so far (0 while the database does not exist yet)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM target_results").fetchone()[0])
        except sqlite3.OperationalError:  # the schema is not there yet
            return 0


def kill_quietly(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# A playbook that touches a file per step: fast, idempotent, and shows which steps ran.
def marker_steps(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "check": f"test -f /root/{name}", "apply": f"touch /root/{name}"}
            for name in names]


# -- rows 1, 3, 4: the node cannot be connected ---------------------------------------------------------


@pytest.fixture
def two_nodes(lab_factory: Callable[..., Lab]) -> tuple[Lab, Container]:
    """A private lab: pve1 with a running CT 200 (the target that must still complete), pve2 bare."""
    bed = lab_factory(nodes=2)
    return bed, bed.add_container("pve1", 200)


def _refused(bed: Lab, tmp: Path) -> tuple[dict[str, Any], str]:
    dead = node_entry(bed, name="dead", address="127.0.0.9", port=free_port("127.0.0.9"))
    return dead, "connection refused"


def _wrong_key(bed: Lab, tmp: Path) -> tuple[dict[str, Any], str]:
    keygen(tmp / "stranger", "not-authorized")
    return node_entry(bed, "pve2", identity_file=str(tmp / "stranger")), "authentication rejected"


def _unknown_key(bed: Lab, tmp: Path) -> tuple[dict[str, Any], str]:
    (tmp / "empty_known_hosts").write_text("")
    node = bed.node("pve2").ssh
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(node.state_dir / "ssh_host_ed25519_key.pub")],
        capture_output=True, text=True, check=True).stdout.split()[1]
    return node_entry(bed, "pve2", known_hosts=str(tmp / "empty_known_hosts")), fingerprint


def _changed_key(bed: Lab, tmp: Path) -> tuple[dict[str, Any], str]:
    node = bed.node("pve2").ssh
    impostor = keygen(tmp / "impostor", "impostor").split()[:2]
    (tmp / "changed_known_hosts").write_text(f"[{node.address}]:{node.port} {' '.join(impostor)}\n")
    return node_entry(bed, "pve2", known_hosts=str(tmp / "changed_known_hosts")), "HAS CHANGED"


@pytest.mark.parametrize("fault", [_refused, _wrong_key, _unknown_key, _changed_key],
                         ids=["1-refused", "3-auth-fails", "4-unknown-host-key", "4-changed-host-key"])
def test_node_that_cannot_be_connected(
    two_nodes: tuple[Lab, Container], tmp_path: Path,
    fault: Callable[[Lab, Path], tuple[dict[str, Any], str]],
) -> None:
    bed, ct = two_nodes
    bad_node, expected = fault(bed, tmp_path)
    known_hosts_before = {p: p.read_text() for p in tmp_path.glob("*known_hosts")}
    inventory = write_nodes(tmp_path / "inventory.yaml", [
        node_entry(bed, "pve1", containers=[(ct.ctid, {})]), bad_node])
    db = tmp_path / "audit.db"

    result = run_cli("audit", "-i", str(inventory), "--db", str(db), "--json")
    assert result.exit_code == EXIT_UNREACHABLE, result.stdout + result.stderr
    targets = by_target(result.json()["targets"])
    assert targets[f"pve1/{ct.ctid}"]["status"] == "ok"
    bad = targets[bad_node["name"]]
    assert bad["status"] == "unreachable"
    assert expected in one_line(bad["error"])
    # History keeps both targets; the run itself completed.
    [run] = audit_history(db)
    assert (run["status"], run["targets"], run["unreachable"]) == ("complete", 2, 1)
    # A refused host key is never written to known_hosts.
    assert {p: p.read_text() for p in tmp_path.glob("*known_hosts")} == known_hosts_before


# -- row 2: a blackholed node (network namespace, replies dropped) -------------------------------------


@dataclass
class NetnsNode:
    name: str
    node: SshNode

    def blackhole(self) -> None:
        # The namespace drops every reply to this machine: SYNs arrive, nothing comes back.
        subprocess.run(["nsenter", f"--net=/run/netns/{self.name}", "ip", "route", "add", "blackhole",
                        "198.18.0.1/32"], check=True)


@pytest.fixture
def netns_node(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NetnsNode]:
    """sshd inside a network namespace at 198.18.0.2, linked to this machine by a veth pair (198.18.0.1).
    The `unreachable 198.18.0.0/15` guard route keeps anything else in that range off the real network."""
    if shutil.which("ip") is None:
        if in_ci():
            pytest.fail("CI=true and `ip` (iproute2) is missing", pytrace=False)
        pytest.skip("needs `ip` (apt-get install iproute2)")
    name = f"ff{os.getpid() % 100000}"
    guard_added = subprocess.run(["ip", "route", "add", "unreachable", "198.18.0.0/15"],
                                 capture_output=True).returncode == 0
    inside = ["nsenter", f"--net=/run/netns/{name}"]
    started: SshNode | None = None
    try:
        for command in (["ip", "netns", "add", name],
                        ["ip", "link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}n"],
                        ["ip", "link", "set", f"{name}n", "netns", name],
                        ["ip", "addr", "add", "198.18.0.1/30", "dev", f"{name}h"],
                        ["ip", "link", "set", f"{name}h", "up"],
                        [*inside, "ip", "addr", "add", "198.18.0.2/30", "dev", f"{name}n"],
                        [*inside, "ip", "link", "set", f"{name}n", "up"],
                        [*inside, "ip", "link", "set", "lo", "up"]):
            subprocess.run(command, check=True, capture_output=True)
        # start_node runs `unshare ...`: a shim first on PATH runs it inside the namespace.
        shim = tmp_path / "shim"
        shim.mkdir()
        (shim / "unshare").write_text(f'#!/bin/sh\nexec {" ".join(inside)} /usr/bin/unshare "$@"\n')
        (shim / "unshare").chmod(0o755)
        monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
        started = start_node(lab.root / f"netns-{name}", name="far", address="198.18.0.2", port=22,
                             authorized_keys=[lab.client_public_key])
        monkeypatch.undo()
        with lab.known_hosts.open("a") as handle:
            handle.write(started.known_hosts_line + "\n")
        yield NetnsNode(name, started)
    finally:
        if started is not None:
            started.stop()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes the veth pair along
        if guard_added:
            subprocess.run(["ip", "route", "del", "unreachable", "198.18.0.0/15"], capture_output=True)


@pytest.mark.slow
def test_2_blackholed_node_hits_the_connect_timeout(
    lab: Lab, make_ct: Callable[..., Container], netns_node: NetnsNode, tmp_path: Path,
) -> None:
    ct = make_ct()
    far = node_entry(lab, name="far", address="198.18.0.2", port=22, connect_timeout=2)
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(lab, containers=[(ct.ctid, {})]), far])
    reachable = run_cli("exec", "-i", str(inventory), "--json", "--", "true")
    assert reachable.exit_code == 0, reachable.stdout + reachable.stderr  # the link works before the fault

    netns_node.blackhole()
    started = time.monotonic()
    result = run_cli("exec", "-i", str(inventory), "--json", "--", "true")
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_UNREACHABLE, result.stdout + result.stderr
    outcomes = by_target(result.json())
    assert outcomes[f"{lab.node().name}/{ct.ctid}"]["status"] == "ok"
    assert outcomes["far"]["status"] == "unreachable"
    assert "connect timed out after 2s" in one_line(outcomes["far"]["error"])
    assert elapsed < 2 + 6, f"the 2 s connect timeout was not honoured: {elapsed:.1f}s"

    db = tmp_path / "audit.db"
    audited = run_cli("audit", "-i", str(inventory), "--db", str(db), "--json")
    assert audited.exit_code == EXIT_UNREACHABLE
    assert by_target(audited.json()["targets"])["far"]["duration"] < 5
    [run] = audit_history(db)
    assert (run["status"], run["targets"], run["unreachable"]) == ("complete", 2, 1)


# -- row 5: a stopped container, a container not on the node --------------------------------------------


def test_5_stopped_and_missing_containers(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    good, stopped = make_ct(), make_ct(running=False)
    missing = 999_999
    assert not lab.node().container(missing).exists()
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(good.ctid, {}), (stopped.ctid, {}), (missing, {})])])
    playbook = write_playbook(tmp_path / "markers.yaml", marker_steps("one", "two"))
    state = tmp_path / "state"

    result = run_cli("apply", str(playbook), "-i", str(inventory), "--state-dir", str(state), "--json")
    assert result.exit_code == EXIT_UNREACHABLE, result.stdout + result.stderr
    node = lab.node().name
    targets = by_target(result.json()["targets"])
    assert targets[f"{node}/{good.ctid}"]["status"] == "changed"
    assert (good.upper_dir / "root/two").exists()
    assert targets[f"{node}/{stopped.ctid}"]["status"] == "unreachable"
    assert f"CT {stopped.ctid} on {node} is stopped" in one_line(targets[f"{node}/{stopped.ctid}"]["reason"])
    assert f"CT {missing} does not exist on {node}" in one_line(targets[f"{node}/{missing}"]["reason"])

    [run] = runs(state)
    assert run["status"] == "unreachable"
    recorded = run_detail(state, run["run_id"])["targets"]
    assert {name: t["status"] for name, t in recorded.items()} == {
        f"{node}/{good.ctid}": "changed", f"{node}/{stopped.ctid}": "unreachable",
        f"{node}/{missing}": "unreachable"}

    db = tmp_path / "audit.db"
    audited = run_cli("audit", "-i", str(inventory), "--db", str(db), "--json")
    assert audited.exit_code == EXIT_UNREACHABLE
    assert by_target(audited.json()["targets"])[f"{node}/{good.ctid}"]["status"] == "ok"
    assert audit_history(db)[0]["unreachable"] == 2


# -- row 6: a step past its timeout: failed, and the remote process is gone ----------------------------


def test_6_step_timeout_kills_the_remote_process(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    slow, quick = make_ct(), make_ct()
    marker = f"3{unique()}.5"
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(slow.ctid, {"nap": marker}), (quick.ctid, {"nap": "0"})])])
    playbook = write_playbook(tmp_path / "nap.yaml", [
        {"name": "nap", "apply": "sleep {{ nap }}; touch /root/napped", "timeout": 2}])
    state = tmp_path / "state"
    try:
        started = time.monotonic()
        result = run_cli("apply", str(playbook), "-i", str(inventory), "--state-dir", str(state), "--json")
        elapsed = time.monotonic() - started
        assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
        node = lab.node().name
        targets = by_target(result.json()["targets"])
        assert targets[f"{node}/{quick.ctid}"]["status"] == "changed"
        timed_out = targets[f"{node}/{slow.ctid}"]
        assert timed_out["status"] == "failed"
        assert "timed out" in one_line(timed_out["reason"]).lower()
        assert elapsed < 20
        assert not pids_running(f"sleep {marker}"), "the timed-out command is still running"
        assert not (slow.upper_dir / "root/napped").exists()
        [run] = runs(state)
        [script] = run_detail(state, run["run_id"])["targets"][f"{node}/{slow.ctid}"]["steps"][0]["scripts"]
        assert script["timed_out"] is True
    finally:
        kill_quietly(pids_running(f"sleep {marker}"))


# -- row 7: the SSH link cut mid-step; the next run resumes ------------------------------------------


def _session_sshd(pid: int) -> int:
    """The sshd process serving the connection pid runs under: the first sshd among its ancestors."""
    current = pid
    while current > 1:
        stat = Path(f"/proc/{current}/stat").read_text()
        comm, parent = stat[stat.index("(") + 1:stat.rindex(")")], int(stat[stat.rindex(")") + 2:].split()[1])
        if comm == "sshd":
            return current
        current = parent
    raise AssertionError(f"no sshd above pid {pid}")


def test_7_link_cut_mid_step_is_recorded_and_a_rerun_completes(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct()
    other_lab_ct = make_ct()
    marker = f"4{unique()}.5"
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(lab, containers=[(ct.ctid, {})])])
    other = write_nodes(tmp_path / "other.yaml", [node_entry(lab, containers=[(other_lab_ct.ctid, {})])])
    playbook = write_playbook(tmp_path / "resume.yaml", [
        *marker_steps("before"),
        {"name": "long", "check": "test -f /root/long",
         "apply": "echo started long; sleep {{ nap }}; touch /root/long"},
        *marker_steps("after"),
    ])
    state = tmp_path / "state"
    try:
        process = start_cli("apply", str(playbook), "-i", str(inventory), "--state-dir", str(state),
                            "--json", "--var", f"nap={marker}")
        [sleeper] = wait_for(lambda: pids_running(f"sleep {marker}"), 30, "the long step to start")
        os.kill(_session_sshd(sleeper), signal.SIGKILL)  # the node's side of our SSH connection
        result = finish(process)
        # Meanwhile, another target (its own connection) is unaffected.
        assert run_cli("apply", str(playbook), "-i", str(other), "--state-dir", str(tmp_path / "s2"),
                       "--var", "nap=0").exit_code == 0
    finally:
        kill_quietly(pids_running(f"sleep {marker}"))
    assert result.exit_code == EXIT_UNREACHABLE, result.stdout + result.stderr
    name = f"{lab.node().name}/{ct.ctid}"
    [target] = result.json()["targets"]
    assert target["status"] == "unreachable"
    assert "connection lost" in one_line(target["reason"]).lower()
    [run] = runs(state)
    steps = run_detail(state, run["run_id"])["targets"][name]["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("before", "changed"), ("long", "failed")]
    assert steps[1]["scripts"][-1]["error"], "the lost script's error is recorded"
    assert "started long" in steps[1]["scripts"][-1]["stdout"], "and what it printed before the cut"
    assert (ct.upper_dir / "root/before").exists() and not (ct.upper_dir / "root/long").exists()

    rerun = run_cli("apply", str(playbook), "-i", str(inventory), "--state-dir", str(state), "--json",
                    "--var", "nap=0")
    assert rerun.exit_code == 0, rerun.stdout + rerun.stderr
    [again] = rerun.json()["targets"]
    assert [(s["name"], s["status"]) for s in again["steps"]] == [
        ("before", "ok"), ("long", "changed"), ("after", "changed")]


# -- rows 8, 9, 10, 11: apt and dpkg faults inside the container, with cuda-toolkit.yaml ---------------


def keyring_ready(repo: AptRepo) -> Callable[[Container], None]:
    """The problem case plus NVIDIA's keyring and an apt index: the next apt step is the install."""
    def setup(ct: Container) -> None:
        problem_case(ct)
        ct.write_file("/root/cuda-keyring.deb", repo.keyring_deb_path().read_bytes())
        ct.sh("dpkg -i /root/cuda-keyring.deb >/dev/null && rm /root/cuda-keyring.deb\n"
              "apt-get -qq update\n", timeout=120)
    return setup


def apply_cuda(inventory: Path, state: Path, *extra: str) -> CliResult:
    return run_cli("apply", CUDA_PLAYBOOK, "-i", str(inventory), "--state-dir", str(state), "--json", *extra)


def failed_step(target: dict[str, Any]) -> dict[str, Any]:
    step: dict[str, Any] = next(s for s in target["steps"] if s["status"] == "failed")
    return step


def finding_codes(report: dict[str, Any]) -> set[str]:
    return {finding["code"] for finding in report["findings"]}


@pytest.mark.slow
def test_8_dpkg_lock_held_waits_for_the_timeout_then_fails(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    locked, free = make_ct(setup=keyring_ready(apt_repo)), make_ct(setup=keyring_ready(apt_repo))
    # An fcntl lock, as apt and dpkg take it (flock(1)'s flock(2) locks are invisible to them).
    hold = f"6{unique()}"
    locked.sh(f"setsid python3 -c 'import fcntl, time; f = open(\"/var/lib/dpkg/lock-frontend\", \"w\"); "
              f"fcntl.lockf(f, fcntl.LOCK_EX); time.sleep({hold})' >/dev/null 2>&1 < /dev/null &")
    try:
        wait_for(lambda: "lock-frontend" in locked.sh("cat /proc/locks; ls -i /var/lib/dpkg/lock-frontend",
                                                      check=False).stdout.decode(), 10, "the lock")
        inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
            lab, containers=[(locked.ctid, {}), (free.ctid, {})])])
        node = lab.node().name

        probed = run_cli("probe", "-i", str(inventory), "--json")
        reports = by_target(probed.json()["targets"])
        assert "DPKG_LOCK_HELD" in finding_codes(reports[f"{node}/{locked.ctid}"])
        assert "DPKG_LOCK_HELD" not in finding_codes(reports[f"{node}/{free.ctid}"])

        result = apply_cuda(inventory, tmp_path / "state", "--var", f"cuda_repo_base={apt_repo.base_url}",
                            "--var", "apt_lock_timeout=5")
        assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
        targets = by_target(result.json()["targets"])
        assert targets[f"{node}/{free.ctid}"]["status"] == "changed"
        blocked = targets[f"{node}/{locked.ctid}"]
        assert blocked["status"] == "failed"
        step = failed_step(blocked)
        assert step["name"] == "toolkit packages installed"
        output = step["stdout"] + step["stderr"]
        # apt names the holder when it can read it ("Could not get lock ... It is held by process N"),
        # else "Unable to acquire the dpkg frontend lock (...lock-frontend), is another process using it?".
        assert "/var/lib/dpkg/lock-frontend" in output, output
        assert "Could not get lock" in output or "Unable to acquire the dpkg frontend lock" in output, output
        assert step["duration"] >= 4.5, "apt did not wait for the configured lock timeout"
        one_line(blocked["reason"])
    finally:
        kill_quietly(pids_running(f"time.sleep\\({hold}\\)"))


@pytest.mark.slow
def test_8b_dpkg_lock_held_at_the_keyring_waits_apt_lock_timeout_and_names_the_holder(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    """dpkg -i has no lock timeout of its own: the playbook waits at most apt_lock_timeout (not ~5 min
    whatever it says) and the failure line is dpkg's informative one, not its trailing "Note:"."""
    locked = make_ct(setup=problem_case)
    hold = f"6{unique()}"
    locked.sh(f"setsid python3 -c 'import fcntl, time; f = open(\"/var/lib/dpkg/lock-frontend\", \"w\"); "
              f"fcntl.lockf(f, fcntl.LOCK_EX); time.sleep({hold})' >/dev/null 2>&1 < /dev/null &")
    try:
        wait_for(lambda: "lock-frontend" in locked.sh("cat /proc/locks; ls -i /var/lib/dpkg/lock-frontend",
                                                      check=False).stdout.decode(), 10, "the lock")
        inventory = write_nodes(tmp_path / "inventory.yaml",
                                [node_entry(lab, containers=[(locked.ctid, {})])])
        result = apply_cuda(inventory, tmp_path / "state", "--var", f"cuda_repo_base={apt_repo.base_url}",
                            "--var", "apt_lock_timeout=5")
        assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
        [blocked] = result.json()["targets"]
        step = failed_step(blocked)
        assert step["name"] == "cuda-keyring installed"
        # Waited for the lock (whole seconds, counted with `date +%s`: 5 s can read as 4.x), but not dpkg's
        # own ~5 minutes.
        assert 3.5 <= step["duration"] < 60, step["duration"]
        reason = one_line(blocked["reason"])
        assert "dpkg frontend lock was locked by another process with pid" in reason, reason
        assert "apt_lock_timeout" in reason
    finally:
        kill_quietly(pids_running(f"time.sleep\\({hold}\\)"))


@pytest.mark.slow
def test_9_dpkg_interrupted_is_found_and_repaired_as_a_visible_step(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    """The probe reports DPKG_INTERRUPTED with `dpkg --configure -a`; cuda-toolkit.yaml repairs it in a
    step of its own before installing, instead of failing later with apt's parse of dpkg's state."""
    def interrupted(ct: Container) -> None:
        keyring_ready(apt_repo)(ct)
        # A pending journal entry, as a dpkg run killed mid-way leaves it: a valid stanza of dash's.
        ct.sh("mkdir -p /var/lib/dpkg/updates && dpkg-query -s dash > /var/lib/dpkg/updates/0001")

    ct = make_ct(setup=interrupted)
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(lab, containers=[(ct.ctid, {})])])
    node = lab.node().name
    reports = by_target(run_cli("probe", "-i", str(inventory), "--json").json()["targets"])
    finding = next(f for f in reports[f"{node}/{ct.ctid}"]["findings"] if f["code"] == "DPKG_INTERRUPTED")
    assert "dpkg --configure -a" in json.dumps(finding)

    result = apply_cuda(inventory, tmp_path / "state", "--var", f"cuda_repo_base={apt_repo.base_url}")
    assert result.exit_code == 0, result.stdout + result.stderr
    [target] = result.json()["targets"]
    steps = {s["name"]: s["status"] for s in target["steps"]}
    assert steps["dpkg not interrupted"] == "changed"
    assert steps["toolkit packages installed"] == "changed"
    assert ct.sh("ls /var/lib/dpkg/updates").stdout.decode().split() == []


@pytest.mark.slow
def test_10_disk_full_during_install_fails_with_apts_message(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    def full_archives(ct: Container) -> None:
        keyring_ready(apt_repo)(ct)
        # A one-page tmpfs over apt's download dir, inside the CT's own mount namespace, filled up.
        ct.sh("mount -t tmpfs -o size=4k tmpfs /var/cache/apt/archives\n"
              "mkdir -p /var/cache/apt/archives/partial\n"
              "dd if=/dev/zero of=/var/cache/apt/archives/filler bs=4k 2>/dev/null || true\n")

    full, fine = make_ct(setup=full_archives), make_ct(setup=keyring_ready(apt_repo))
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(full.ctid, {}), (fine.ctid, {})])])
    node = lab.node().name
    result = apply_cuda(inventory, tmp_path / "state", "--var", f"cuda_repo_base={apt_repo.base_url}")
    assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
    targets = by_target(result.json()["targets"])
    assert targets[f"{node}/{fine.ctid}"]["status"] == "changed"
    step = failed_step(targets[f"{node}/{full.ctid}"])
    output = step["stdout"] + step["stderr"]
    assert "enough free space" in output or "No space left on device" in output, output
    # Nothing else broken: dpkg's database is consistent and no package half-installed.
    assert full.sh("dpkg --audit", check=False).stdout == b""
    [report] = run_cli("probe", "-i", str(write_nodes(tmp_path / "one.yaml", [node_entry(
        lab, containers=[(full.ctid, {})])])), "--json").json()["targets"]
    assert "DPKG_INTERRUPTED" not in finding_codes(report)


@pytest.mark.slow
def test_11_unreachable_mirror_names_the_url(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    """(The 404 case is tests/e2e/test_cli_apply.py::test_a_failing_container_is_reported_and_the_other_
    still_fixed.) A mirror nobody answers on: a loopback port with nothing listening."""
    dead_mirror = f"http://127.0.0.1:{free_port()}/compute/cuda/repos"
    broken, fine = make_ct(setup=problem_case), make_ct(setup=problem_case)
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(lab, containers=[
        (broken.ctid, {"cuda_repo_base": dead_mirror}), (fine.ctid, {"cuda_repo_base": apt_repo.base_url})])])
    node = lab.node().name
    result = apply_cuda(inventory, tmp_path / "state")
    assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
    targets = by_target(result.json()["targets"])
    assert targets[f"{node}/{fine.ctid}"]["status"] == "changed"
    step = failed_step(targets[f"{node}/{broken.ctid}"])
    output = step["stdout"] + step["stderr"]
    assert dead_mirror in output and "refused" in output.lower(), output


# -- row 12: Ctrl-C -----------------------------------------------------------------------------------


def nap_playbook(path: Path) -> Path:
    return write_playbook(path, [{"name": "nap", "check": "test -f /root/napped",
                                  "apply": "sleep {{ nap }}; touch /root/napped"}])


@contextlib.contextmanager
def napping_apply(lab: Lab, cts: Sequence[Container], tmp_path: Path, nap: str
                  ) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """`fleetfix apply` of nap_playbook on cts, one at a time (--serial 1: there is always a next target
    not yet started), yielded (state dir, process) once the first target's `sleep NAP` runs; whatever
    still sleeps is killed afterwards."""
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(ct.ctid, {}) for ct in cts])])
    state = tmp_path / "state"
    process = start_cli("apply", str(nap_playbook(tmp_path / "nap.yaml")), "-i", str(inventory),
                        "--state-dir", str(state), "--serial", "1", "--var", f"nap={nap}")
    try:
        wait_for(lambda: pids_running(f"sleep {nap}"), 30, "the first target's step")
        yield state, process
    finally:
        kill_quietly(pids_running(f"sleep {nap}"))


def test_12_ctrl_c_during_apply_finishes_in_flight_and_starts_nothing_new(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    cts = [make_ct() for _ in range(3)]
    with napping_apply(lab, cts, tmp_path, f"2.{unique()}") as (state, process):
        process.send_signal(signal.SIGINT)
        result = finish(process)
    assert result.exit_code == EXIT_INTERRUPTED, result.stdout + result.stderr
    assert "PLAY RECAP" in result.stdout
    assert "interrupted" in result.stderr and "Traceback" not in result.stderr
    napped = [(ct.upper_dir / "root/napped").exists() for ct in cts]
    assert napped == [True, False, False], "the in-flight target must finish, no other may start"
    [run] = runs(state)
    detail = run_detail(state, run["run_id"])
    node = lab.node().name
    statuses = {name: t["status"] for name, t in detail["targets"].items()}
    assert statuses == {f"{node}/{cts[0].ctid}": "changed", f"{node}/{cts[1].ctid}": "failed",
                        f"{node}/{cts[2].ctid}": "failed"}
    assert "interrupted" in detail["targets"][f"{node}/{cts[1].ctid}"]["reason"]
    assert run["status"] != "incomplete"  # the run-end event was written


def test_12_second_ctrl_c_aborts_at_once_and_records_stay_readable(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    cts = [make_ct() for _ in range(2)]
    with napping_apply(lab, cts, tmp_path, f"3{unique()}.5") as (state, process):
        stderr = LineWatcher(process.stderr)
        process.send_signal(signal.SIGINT)
        wait_for(lambda: "starting no new targets" in stderr.text(), 10, "the first Ctrl-C to be handled")
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        assert time.monotonic() - started < 5, "the second Ctrl-C did not abort at once"
        assert process.stdout is not None
        result = CliResult(process.returncode, process.stdout.read(), stderr.join())
    assert result.exit_code == EXIT_INTERRUPTED, result.stdout + result.stderr
    assert "aborted" in result.stderr
    [run] = runs(state)
    assert run["status"] == "incomplete"
    events = (state / "runs" / run["run_id"] / "events.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in events), "every recorded line is whole JSON"
    assert run_cli("runs", "show", run["run_id"], "--state-dir", str(state)).exit_code == 0


def slow_python(seconds: str) -> Callable[[Container], None]:
    """A CT whose `python` var names an interpreter that takes `seconds` before it answers."""
    def setup(ct: Container) -> None:
        ct.write_file("/usr/bin/slowpython", f"#!/bin/sh\nsleep {seconds}\nexec python3 \"$@\"\n", 0o755)
    return setup


def test_12_ctrl_c_during_audit_keeps_finished_targets(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    marker = f"2.{unique()}"
    # More targets than channels on one connection (8): the last ones wait for a free channel.
    cts = [make_ct(setup=slow_python(marker)) for _ in range(10)]
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(ct.ctid, {"python": "/usr/bin/slowpython"}) for ct in cts])])
    db = tmp_path / "audit.db"
    process = start_cli("audit", "-i", str(inventory), "--db", str(db), "--json")
    try:
        wait_for(lambda: len(pids_running(f"sleep {marker}")) >= 8, 60, "eight probes in flight")
        process.send_signal(signal.SIGINT)
        result = finish(process)
        # The node ran the containers over one channel: it never started the two the run did not start
        # (their probe would still be asleep here, as each of the eight was for 2 s).
        started_after = pids_running(f"sleep {marker}")
    finally:
        kill_quietly(pids_running(f"sleep {marker}"))
    assert not started_after, "containers were started on the node after the interrupt"
    assert result.exit_code == EXIT_INTERRUPTED, result.stdout + result.stderr
    report = result.json()
    statuses = [t["status"] for t in report["targets"]]
    assert statuses.count("ok") == 8 and statuses.count("failed") == 2, statuses
    assert all("interrupted" in t["error"] for t in report["targets"] if t["status"] == "failed")
    [run] = audit_history(db)
    assert run["targets"] == 10
    assert run["status"] == "incomplete"  # never the drift baseline of the next audit


# -- row 13: the controller SIGKILLed mid-run --------------------------------------------------------


def test_13_sigkill_mid_apply_leaves_an_incomplete_run(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    cts = [make_ct() for _ in range(2)]
    with napping_apply(lab, cts, tmp_path, f"3{unique()}.5") as (state, process):
        process.kill()
        finish(process)
    [run] = runs(state)
    assert run["status"] == "incomplete"
    shown = run_cli("runs", "show", run["run_id"], "--state-dir", str(state), "--json")
    assert shown.exit_code == 0
    node = lab.node().name
    first = shown.json()["targets"][f"{node}/{cts[0].ctid}"]
    assert first["steps"][0]["scripts"][-1]["finished"] is False  # started, never ended: recorded as such


def test_13_sigkill_mid_audit_leaves_history_incomplete_and_usable(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    marker = f"3.{unique()}"
    quick, slow = make_ct(), make_ct(setup=slow_python(marker))
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(quick.ctid, {}), (slow.ctid, {"python": "/usr/bin/slowpython"})])])
    db = tmp_path / "audit.db"
    process = start_cli("audit", "-i", str(inventory), "--db", str(db), "--json")
    try:
        wait_for(lambda: pids_running(f"sleep {marker}"), 60, "the slow probe")
        wait_for(lambda: committed_targets(db) >= 1, 60, "the quick target's result to be committed")
        process.kill()
        finish(process)
    finally:
        kill_quietly(pids_running(f"sleep {marker}"))
    [run] = audit_history(db)
    assert run["status"] == "incomplete"
    assert run["targets"] == 1  # the finished target was kept
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # The next audit starts cleanly and records a complete run next to the incomplete one.
    again = run_cli("audit", "-i", str(inventory), "--limit", f"*/{quick.ctid}", "--db", str(db), "--json")
    assert again.exit_code in (0, 3), again.stdout + again.stderr
    assert [r["status"] for r in audit_history(db)] == ["complete", "incomplete"]


# -- row 14: one very slow container among a hundred -----------------------------------------------


@pytest.mark.slow
def test_14_a_slow_container_does_not_hold_up_a_hundred_others(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    cts = [make_ct() for _ in range(100)]
    marker = f"6{unique()}.5"
    cts[0].write_file("/root/slow", "")
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(ct.ctid, {}) for ct in cts])])
    # The same command everywhere; on the one CT with /root/slow it sleeps far past the timeout.
    command = f"if [ -f /root/slow ]; then sleep {marker}; fi; hostname"
    try:
        started = time.monotonic()
        result = run_cli("exec", "-i", str(inventory), "--timeout", "5", "--json", "--", "sh", "-c", command)
        elapsed = time.monotonic() - started
    finally:
        kill_quietly(pids_running(f"sleep {marker}"))
    assert result.exit_code == EXIT_FAILED, result.stdout + result.stderr
    outcomes = result.json()
    slow = outcomes[0]
    assert slow["timed_out"] is True
    assert all(o["exit_code"] == 0 for o in outcomes[1:])
    # 99 quick commands through 8 channels take a few seconds; the slow one holds one channel for its
    # own 5 s timeout only. Serialised behind it, the run would take longer than the timeout times
    # the channels it blocked, and the others would wait for it.
    assert elapsed < 60, elapsed
    quick_durations = sorted(o["duration"] for o in outcomes[1:])
    assert quick_durations[-1] < 5, quick_durations[-5:]
    assert not pids_running(f"sleep {marker}")


# -- hostile input: nothing from the inventory or a container is executed -------------------------------

HOSTILE = "it's \"q\" $(touch /canary-a) `touch /canary-b`; touch /canary-c\n&& touch /canary-d | ünï ✓ \\"
CANARIES = ("canary-a", "canary-b", "canary-c", "canary-d", "canary-py")


def assert_no_canary(cts: Sequence[Container]) -> None:
    for name in CANARIES:
        assert not Path("/", name).exists(), f"/{name} appeared on this machine (the node)"
        for ct in cts:
            assert not (ct.upper_dir / name).exists(), f"/{name} appeared in CT {ct.ctid}"


def test_hostile_vars_reach_scripts_as_data_only(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct()
    hostile_python = "python3; touch /canary-py #"
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(ct.ctid, {"note": HOSTILE, "python": hostile_python})])])
    playbook = write_playbook(tmp_path / "echo.yaml", [
        {"name": "write note", "check": "test -f /root/note",
         "apply": "printf '%s' {{ note }} > /root/note"}])
    applied = run_cli("apply", str(playbook), "-i", str(inventory), "--state-dir", str(tmp_path / "s"),
                      "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert (ct.upper_dir / "root/note").read_text() == HOSTILE  # arrived verbatim, as one argument

    probed = run_cli("probe", "-i", str(inventory), "--json")
    assert probed.exit_code in (0, 3), probed.stdout + probed.stderr
    [report] = probed.json()["targets"]
    assert report["status"] == "ok"
    # The hostile interpreter name was looked up as one word (not found), never run as a command line.
    [python] = report["facts"]["pythons"]
    assert (python["interpreter"], python["found"]) == (hostile_python, False)

    executed = run_cli("exec", "-i", str(inventory), "--json", "--", "printf", "%s", HOSTILE)
    assert executed.json()[0]["stdout"] == HOSTILE
    assert_no_canary([ct])


@pytest.mark.parametrize("where", ["node name", "tag", "var name"])
def test_hostile_names_are_refused_in_one_line(lab: Lab, tmp_path: Path, where: str) -> None:
    entry = node_entry(lab, containers=[(200, {})])
    if where == "node name":
        entry["name"] = "pve1; touch /canary-a"
    elif where == "tag":
        entry["tags"] = ["gpu$(touch /canary-b)"]
    else:
        entry["containers"][0]["vars"] = {"x`touch /canary-c`": 1}
    inventory = write_nodes(tmp_path / "inventory.yaml", [entry])
    result = run_cli("exec", "-i", str(inventory), "--", "true")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stderr.startswith("fleetfix: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert str(inventory) in result.stderr
    assert_no_canary([])


def broken_shell(kind: str) -> Callable[[Container], None]:
    """A compromised or broken CT: its /bin/sh (what runs the probe) prints something else."""
    bodies = {
        "truncated": '/bin/bash "$@" | head -c 300',
        "garbage": "cat >/dev/null; printf '%s\\n' 'not json $(touch /canary-a) `touch /canary-b`'",
        "huge": "cat >/dev/null; printf '{\"fleetfix_probe\":1,\"x\":\"'; "
                "head -c 6000000 /dev/zero | tr '\\0' a",
    }

    def setup(ct: Container) -> None:
        ct.sh(f"rm /bin/sh && printf '%s\\n' '#!/bin/bash' {shlex.quote(bodies[kind])} > /bin/sh "
              "&& chmod 755 /bin/sh")
    return setup


def test_broken_probe_output_is_a_clear_per_target_error(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    good = make_ct()
    broken = {kind: make_ct(setup=broken_shell(kind)) for kind in ("truncated", "garbage", "huge")}
    inventory = write_nodes(tmp_path / "inventory.yaml", [node_entry(
        lab, containers=[(good.ctid, {}), *[(ct.ctid, {}) for ct in broken.values()]])])
    result = run_cli("probe", "-i", str(inventory), "--json")
    assert result.exit_code == EXIT_UNREACHABLE, result.stdout + result.stderr
    reports = by_target(result.json()["targets"])
    node = lab.node().name
    assert reports[f"{node}/{good.ctid}"]["status"] == "ok"
    expected = {"truncated": "truncated", "garbage": "not JSON", "huge": "byte cap"}
    for kind, ct in broken.items():
        report = reports[f"{node}/{ct.ctid}"]
        assert report["status"] == "failed", report
        assert expected[kind] in one_line(report["error"]), report["error"]
        assert len(report["error"]) < 400
    assert_no_canary([good, *broken.values()])


# -- secrets: never written anywhere during a run -----------------------------------------------------


@dataclass
class SecretRun:
    secrets: dict[str, str]  # what -> value
    outputs: list[CliResult]
    written: list[Path]  # every file the runs wrote
    first_run_steps: list[dict[str, Any]]


@pytest.fixture(scope="module")
def secret_run(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretRun]:
    """apply (text, --json, -v) and audit with an API token (--var), an inventory `password` var and an
    encrypted SSH key's passphrase ($FLEETFIX_SSH_PASSPHRASE); a playbook that echoes the first two."""
    tmp = tmp_path_factory.mktemp("secrets")
    secrets = {"api token": f"tok-{uuid.uuid4().hex}", "password var": f"pw-{uuid.uuid4().hex}",
               "key passphrase": f"pp-{uuid.uuid4().hex}"}
    ctid = next(c for c in range(700, 800) if not lab.node().container(c).exists())
    ct = lab.add_container(None, ctid)
    try:
        encrypted_key = tmp / "encrypted_ed25519"
        encrypted_key.write_bytes(lab.client_key.read_bytes())
        encrypted_key.chmod(0o600)
        subprocess.run(["ssh-keygen", "-q", "-p", "-a", "1", "-N", secrets["key passphrase"],
                        "-f", str(encrypted_key)], check=True, capture_output=True)
        inventory = write_nodes(tmp / "inventory.yaml", [node_entry(
            lab, identity_file=str(encrypted_key),
            containers=[(ct.ctid, {"password": secrets["password var"]})])])
        playbook = write_playbook(tmp / "secret.yaml", [
            {"name": "use them", "apply": "echo token={{ api_token }} password={{ password }}; "
                                          "echo stderr {{ api_token }} >&2"},
            {"name": "fail loudly", "apply": "echo {{ api_token }} {{ password }}; exit 3"},
        ])
        state = tmp / "state"
        env = {"FLEETFIX_SSH_PASSPHRASE": secrets["key passphrase"], "FLEETFIX_STATE_DIR": str(state),
               "FLEETFIX_AUDIT_DB": str(tmp / "audit.db")}
        apply = ["apply", str(playbook), "-i", str(inventory), "--var", f"api_token={secrets['api token']}"]
        outputs = [run_cli(*apply, env=env), run_cli(*apply, "--json", env=env),
                   run_cli("-v", *apply, env=env), run_cli("audit", "-i", str(inventory), "--json", env=env)]
        assert [o.exit_code for o in outputs[:3]] == [EXIT_FAILED] * 3, outputs[0].stdout + outputs[0].stderr
        assert outputs[3].exit_code in (0, 3), outputs[3].stdout + outputs[3].stderr
        [first, *_] = runs(state)
        steps = run_detail(state, first["run_id"])["targets"][f"{lab.node().name}/{ct.ctid}"]["steps"]
        # Everything the runs wrote: below tmp (records), and the audit DB with its WAL files; not the
        # inputs next to them (the inventory holds the password on purpose).
        written = [path for path in tmp.rglob("*")
                   if path.is_file() and (path.parent != tmp or path.name.startswith("audit.db"))]
        yield SecretRun(secrets, outputs, written, steps)
    finally:
        ct.destroy()


def test_secrets_never_written_to_run_records_or_audit_history(secret_run: SecretRun) -> None:
    assert any(path.name == "events.jsonl" for path in secret_run.written)
    assert any(path.name == "audit.db" for path in secret_run.written)
    for what, secret in secret_run.secrets.items():
        for path in secret_run.written:
            assert secret.encode() not in path.read_bytes(), f"the {what} was written to {path}"
    # The secrets did reach the script (masked in the record): a run that never used them proves nothing.
    assert "token=******** password=********" in secret_run.first_run_steps[0]["scripts"][0]["stdout"]


def test_key_passphrase_never_printed(secret_run: SecretRun) -> None:
    passphrase = secret_run.secrets["key passphrase"]
    for output in secret_run.outputs:
        assert passphrase not in output.stdout + output.stderr


def test_secret_vars_never_printed(secret_run: SecretRun) -> None:
    for what in ("api token", "password var"):
        for output in secret_run.outputs:
            assert secret_run.secrets[what] not in output.stdout + output.stderr, what
