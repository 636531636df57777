"""Issue 6's snapshot acceptance through the real CLI: `apply --snapshot` on the test bed's pct stand-in."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from tests.e2e.conftest import host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest

# Step 1 changes a file; step 2 changes another and then fails its verify: a half-applied container.
FAILING = """\
name: half-applied
steps:
  - name: write marker
    check: test -f /etc/fleetfix-marker
    apply: echo changed > /etc/fleetfix-marker
  - name: break things
    check: test -f /etc/fleetfix-second
    apply: echo changed > /etc/fleetfix-second && rm -rf /usr/share/doc/dpkg
    verify: echo "verify says no" >&2; exit 1
"""
# Always changes (no check): each apply takes a snapshot.
ALWAYS = """\
name: always
steps:
  - name: stamp
    apply: date +%s%N > /etc/fleetfix-stamp
"""
SNAPSHOT_LINE = re.compile(r"^\s*`-> (\S+)", re.MULTILINE)


def book(tmp_path: Path, text: str, name: str = "book.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def snapshots(lab: Lab, ct: Container) -> list[str]:
    listed = lab.ssh(None, ["pct", "listsnapshot", str(ct.ctid)])
    assert listed.returncode == 0, listed.stderr
    return [name for name in SNAPSHOT_LINE.findall(listed.stdout.decode()) if name != "current"]


def pct_commands(lab: Lab, ctid: int, since: int) -> list[list[str]]:
    """pct calls about ctid other than exec, after the first `since` calls (the log is the node's)."""
    calls = lab.node().pct_calls()[since:]
    return [argv for argv in calls if argv[1:2] == [str(ctid)] and argv[0] != "exec"]


def test_failed_apply_is_rolled_back_to_exactly_what_it_was(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct(setup="echo before > /etc/lab-state")
    state = tmp_path / "state"
    before = tree_digest(ct.upper_dir)  # with mtimes: the stand-in's rollback is a `cp -a` copy back
    since = len(lab.node().pct_calls())

    result = run_cli("apply", book(tmp_path, FAILING), *host_args(lab, None, ct.ctid), "--state-dir",
                     str(state), "--snapshot", "--rollback-on-failure")
    assert result.exit_code == 1, result.stdout + result.stderr
    made = pct_commands(lab, ct.ctid, since)  # (before this test's own listsnapshot below)
    [snapshot] = snapshots(lab, ct)
    assert re.fullmatch(r"fleetfix-\d{8}-\d{6}", snapshot)
    assert f"rolled back to {snapshot}" in result.stdout.split("PLAY RECAP")[1]
    # The container is back exactly as it was, and running again (rollback stops it; --start 1 restarts).
    assert ct.running
    assert tree_digest(ct.upper_dir) == before
    assert ct.sh("cat /etc/lab-state").stdout == b"before\n"
    assert [argv[0] for argv in made] == ["status", "snapshot", "rollback"]
    assert made[-1][2:] == [snapshot, "--start", "1"]

    [record] = (state / "runs").iterdir()  # the run record has the rollback as an event
    events = [json.loads(line) for line in (record / "events.jsonl").read_text().splitlines()]
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    assert [(e["snapshot"], e["ok"], e["start"]) for e in rollbacks] == [(snapshot, True, True)]


def test_without_rollback_the_change_stays_and_the_snapshot_is_kept(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct()
    result = run_cli("apply", book(tmp_path, FAILING), *host_args(lab, None, ct.ctid), "--state-dir",
                     str(tmp_path / "state"), "--snapshot", "--json")
    assert result.exit_code == 1
    [target] = result.json()["targets"]
    assert target["snapshot"]["name"] in snapshots(lab, ct)
    assert target["snapshot"]["rolled_back"] is False
    assert ct.sh("cat /etc/fleetfix-marker").stdout == b"changed\n"


def test_keep_snapshots_prunes_only_older_fleetfix_snapshots(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct()
    for name in ("before-upgrade", "fleetfix-20200101-000000", "fleetfix-manual"):
        assert lab.ssh(None, ["pct", "snapshot", str(ct.ctid), name]).returncode == 0
    args = [book(tmp_path, ALWAYS), *host_args(lab, None, ct.ctid), "--state-dir", str(tmp_path / "state")]
    first = run_cli("apply", *args, "--keep-snapshots", "1", "--json")
    assert first.exit_code == 0, first.stdout + first.stderr
    taken = first.json()["targets"][0]["snapshot"]
    assert taken["pruned"] == ["fleetfix-20200101-000000"]
    assert snapshots(lab, ct) == ["before-upgrade", "fleetfix-manual", taken["name"]]


def test_storage_without_snapshots_is_refused_unless_allowed(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    ct = make_ct(config={"rootfs": "local:300/vm-300-disk-0.raw,size=8G"})  # a `dir` storage
    before = tree_digest(ct.upper_dir)
    args = [book(tmp_path, ALWAYS), *host_args(lab, None, ct.ctid), "--state-dir", str(tmp_path / "state")]

    refused = run_cli("apply", *args, "--snapshot")
    assert refused.exit_code == 1, refused.stdout + refused.stderr
    assert "snapshot feature is not available" in refused.stdout
    assert "--allow-no-snapshot" in refused.stdout
    assert tree_digest(ct.upper_dir) == before, "a container without a snapshot was changed"

    allowed = run_cli("apply", *args, "--snapshot", "--allow-no-snapshot", "--json")
    assert allowed.exit_code == 0, allowed.stdout + allowed.stderr
    [target] = allowed.json()["targets"]
    assert target["status"] == "changed"
    assert target["snapshot"]["name"] is None
    assert "snapshot feature is not available" in target["snapshot"]["unavailable"]
    assert ct.sh("test -s /etc/fleetfix-stamp", check=False).returncode == 0


def test_check_mode_takes_no_snapshot(lab: Lab, make_ct: Callable[..., Container], tmp_path: Path) -> None:
    ct = make_ct()
    since = len(lab.node().pct_calls())
    result = run_cli("apply", book(tmp_path, FAILING), *host_args(lab, None, ct.ctid), "--state-dir",
                     str(tmp_path / "state"), "--check", "--snapshot", "--rollback-on-failure",
                     "--keep-snapshots", "1")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "would-change" in result.stdout
    assert pct_commands(lab, ct.ctid, since) == []
    assert snapshots(lab, ct) == []
