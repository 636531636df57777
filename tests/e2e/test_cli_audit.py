"""The nightly audit on the test bed: a container broken between two audits shows as drift, then resolved;
`--remediate` fixes the problem case (and changes nothing with `--check`)."""

from __future__ import annotations

import re
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import healthy, problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


def test_audit_reports_drift_and_its_resolution(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, stub_cache: Path, tmp_path: Path,
) -> None:
    ct = make_ct(setup=lambda c: healthy(c, apt_repo, stub_cache))
    db = tmp_path / "audit.db"
    audit = ["audit", *host_args(lab, None, ct.ctid), "--db", str(db)]

    first = run_cli(*audit, "--json")
    assert first.exit_code == 0, first.stdout + first.stderr

    # Break it: an interrupted dpkg run (what a killed apt leaves behind).
    ct.sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
    junit = tmp_path / "audit.xml"
    second = run_cli(*audit, "--json", "--junit", str(junit), "--html", str(tmp_path / "audit.html"))
    assert second.exit_code == 3, second.stdout + second.stderr
    assert "DPKG_INTERRUPTED" in str(second.json()["drift"]["new_findings"])
    assert ET.parse(junit).getroot().iter("testcase")
    assert "DPKG_INTERRUPTED" in (tmp_path / "audit.html").read_text()

    ct.sh("rm -f /var/lib/dpkg/updates/0001")
    third = run_cli(*audit, "--json")
    assert third.exit_code == 0
    assert "DPKG_INTERRUPTED" in str(third.json()["drift"]["resolved_findings"])

    history = run_cli("audit", "history", "--db", str(db), "--json").json()
    assert len(history) == 3
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _codes(report: dict[str, object], target: str) -> set[str]:
    [result] = [t for t in report["targets"] if t["target"] == target]  # type: ignore[attr-defined]
    return {f["code"] for f in result["findings"]}


@pytest.mark.slow
def test_audit_remediate_fixes_the_problem_case_and_check_changes_nothing(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, tmp_path: Path,
) -> None:
    ct = make_ct(setup=problem_case)
    db, state = tmp_path / "audit.db", tmp_path / "state"
    audit = ["audit", *host_args(lab, None, ct.ctid), "--db", str(db), "--remediate", PLAYBOOK,
             "--var", f"cuda_repo_base={apt_repo.base_url}", "--state-dir", str(state)]

    before = tree_digest(ct.upper_dir)
    checked = run_cli(*audit, "--check", "--json")
    assert checked.exit_code == 3, checked.stdout + checked.stderr
    report = checked.json()
    [target] = [t["target"] for t in report["targets"]]
    assert _codes(report, target) >= TOOLKIT_CODES
    assert report["remediation"]["check"] and not report["remediation"]["reprobed"]
    assert [t["apply_status"] for t in report["remediation"]["targets"]] == ["would-change"]
    assert tree_digest(ct.upper_dir) == before, "audit --remediate --check changed the container"
    assert not ct.config().snapshots

    html = tmp_path / "after.html"
    fixed = run_cli(*audit, "--snapshot", "--json", "--html", str(html))
    assert fixed.exit_code == 0, fixed.stdout + fixed.stderr
    after = fixed.json()
    assert not TOOLKIT_CODES & _codes(after, target), after["targets"]
    assert _codes(after["audit"], target) >= TOOLKIT_CODES  # what the audit itself found
    assert after["run"]["parent"] == after["audit"]["run"]["id"]
    assert after["remediation"]["reprobed"] and after["remediation"]["status"] == "changed"
    [snapshot] = [n for n in ct.config().snapshots if n.startswith("fleetfix-")]  # --snapshot passed on
    assert [t["snapshot"] for t in after["remediation"]["targets"]] == [f"snapshot {snapshot}"]
    resolved = {c["code"] for c in after["drift"]["resolved_findings"]}
    assert resolved >= TOOLKIT_CODES
    assert "remediation of run" in html.read_text()

    # The record of it all: three audit runs (check, audit, re-probe linked to it), two apply runs.
    history = run_cli("audit", "history", "--db", str(db), "--json").json()
    assert [(run["status"], run["parent"]) for run in history] == [
        ("complete", after["audit"]["run"]["id"]), ("complete", None), ("complete", None)]
    applies = run_cli("runs", "list", "--state-dir", str(state), "--json").json()
    assert len(applies) == 2
    assert after["remediation"]["apply_run"] in {run["run_id"] for run in applies}
    shown = run_cli("audit", "show", "last", "--db", str(db))
    [health_after] = [t["health"] for t in after["targets"]]
    assert health_after in ("healthy", "info", "warning")  # fleetfix's other advice may remain
    assert shown.exit_code == 0, shown.stderr
    assert re.search(rf"apply changed +error -> {health_after} .*; snapshot {snapshot}$", shown.stdout,
                     re.MULTILINE), shown.stdout
    # docs/audit.md: `runs show` of the remediation's apply run shows it, "snapshots included".
    apply_run = run_cli("runs", "show", after["remediation"]["apply_run"], "--state-dir", str(state))
    assert f"\n== {target} changed" in apply_run.stdout and f"\n  snapshot {snapshot}\n" in apply_run.stdout

    # Text output, as cron mails it: the audit's report, then the remediation's.
    again = run_cli(*audit)
    assert again.exit_code == 0
    assert "nothing applied" in again.stdout
