"""The nightly audit on the test bed: a container broken between two audits shows as drift, then resolved;
`--remediate` fixes the problem case (and changes nothing with `--check`)."""

from __future__ import annotations

import re
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import healthy, problem_case
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container, tree_digest
from tests.lab.notifyservers import SMTP_PASSWORD, SMTP_USER, MailServer, WebhookReceiver
from tests.lab.tlsca import TestCA
from tests.lab.tlsca import test_ca as test_ca  # the fixture: the SMTP server's certificate
from tests.lab.torch_stub import install_torch

PLAYBOOK = "playbooks/cuda-toolkit.yaml"
TOOLKIT_CODES = {"CUDA_RUNTIME_WITHOUT_TOOLKIT", "NVIDIA_REPO_NOT_CONFIGURED"}


def test_audit_reports_drift_and_its_resolution(
    lab: Lab, make_ct: Callable[..., Container], apt_repo: AptRepo, stub_cache: Path, tmp_path: Path,
    test_ca: TestCA,
) -> None:
    """Also the notifications (docs/audit.md, "Notifications"): a webhook and a mail for each change,
    to loopback receivers, none without a change, and a failing receiver recorded in the run."""
    ct = make_ct(setup=lambda c: healthy(c, apt_repo, stub_cache))
    db = tmp_path / "audit.db"
    policy = tmp_path / "policy.yaml"
    with WebhookReceiver() as hook, MailServer(test_ca) as mail:
        policy.write_text(yaml.safe_dump({"notify": {
            "min_severity": "error",
            "webhook": {"url": "@env:FLEETFIX_WEBHOOK_URL", "timeout": 5},
            "email": {"host": "127.0.0.1", "port": mail.port, "ca_file": str(test_ca.ca_file),
                      "username": SMTP_USER, "password": "@env:SMTP_PASSWORD", "from": "fleetfix@example.org",
                      "to": ["ops@example.org"], "timeout": 5}}}))
        secrets = {"FLEETFIX_WEBHOOK_URL": hook.url, "SMTP_PASSWORD": SMTP_PASSWORD}
        audit = ["audit", *host_args(lab, None, ct.ctid), "--db", str(db), "--policy", str(policy)]

        first = run_cli(*audit, "--json", env=secrets)
        assert first.exit_code == 0, first.stdout + first.stderr
        assert hook.posts == [] and mail.messages == []  # a fresh history without problems: nothing to say

        # Break it: an interrupted dpkg run (what a killed apt leaves behind).
        ct.sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
        junit = tmp_path / "audit.xml"
        second = run_cli(*audit, "--json", "--junit", str(junit), "--html", str(tmp_path / "audit.html"),
                         env=secrets)
        assert second.exit_code == 3, second.stdout + second.stderr
        assert "DPKG_INTERRUPTED" in str(second.json()["drift"]["new_findings"])
        assert ET.parse(junit).getroot().iter("testcase")
        assert "DPKG_INTERRUPTED" in (tmp_path / "audit.html").read_text()
        assert len(hook.posts) == 1 and len(mail.messages) == 1
        [change] = hook.posts[0]["targets"][0]["new"]
        assert change["code"] == "DPKG_INTERRUPTED" and change["severity"] == "error"
        assert mail.messages[0]["Subject"] == "fleetfix audit: 1 new problem"

        unchanged = run_cli(*audit, "--json", env=secrets)
        assert unchanged.exit_code == 3 and len(hook.posts) == 1 and len(mail.messages) == 1

        # Fixed, while the webhook's receiver fails: the mail goes, the run says the webhook failed.
        ct.sh("rm -f /var/lib/dpkg/updates/0001")
        hook.status = 500
        third = run_cli(*audit, "--json", env=secrets)
        assert third.exit_code == 0
        assert "DPKG_INTERRUPTED" in str(third.json()["drift"]["resolved_findings"])
        assert len(hook.posts) == 2 and hook.posts[1]["counts"] == {"new": 0, "resolved": 1}
        assert len(mail.messages) == 2
        assert mail.messages[1]["Subject"] == "fleetfix audit: 0 new problems, 1 resolved"
        [warning] = third.stderr.splitlines()
        assert "webhook failed: 127.0.0.1: HTTP 500" in warning and "email sent" in warning
        printed = third.stdout + third.stderr
        assert hook.url not in printed and SMTP_PASSWORD not in printed

        # Recorded in the run (`audit show` prints it: tests/unit/audit/test_audit_notify.py).
        assert third.json()["run"]["args"]["notification"]["channels"] == {
            "webhook": "failed: 127.0.0.1: HTTP 500 Internal Server Error", "email": "sent"}
    history = run_cli("audit", "history", "--db", str(db), "--json").json()
    assert len(history) == 4
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


def _changes(drift: dict[str, list[dict[str, str]]]) -> set[tuple[str, str, str]]:
    return {(kind, change["target"], change["code"])
            for kind in ("new_findings", "resolved_findings", "severity_changed") for change in drift[kind]}


def test_a_policy_change_is_reported_as_the_policys_not_the_targets(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    """The issue's reproduction: an audit with policy.example.yaml, then one with the built-in policy,
    nothing changed on the targets in between. The drift was "new" GPU_NOT_VISIBLE (the example ignores
    it) and a "resolved" EXTENSION_MISSING (the example requires causal_conv1d); it is the policy's."""
    train = make_ct(setup=problem_case)  # fla without causal_conv1d: EXTENSION_MISSING whatever the policy
    infer = make_ct(setup=lambda ct: install_torch(ct, "2.11.0+cu128", "12.8"))  # no extension at all
    node = lab.node(None)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "defaults": {"identity_file": str(lab.client_key), "known_hosts": str(lab.known_hosts)},
        "nodes": [{"name": node.name, "address": node.address, "port": node.port, "containers": [
            {"ctid": train.ctid, "name": "train", "tags": ["training"]},
            {"ctid": infer.ctid, "name": "infer", "tags": ["inference"]}]}],
    }))
    db, html = tmp_path / "audit.db", tmp_path / "audit.html"
    audit = ["audit", "-i", str(inventory), "--db", str(db)]

    first = run_cli(*audit, "--policy", "policy.example.yaml", "--json")
    assert first.exit_code == 3, first.stdout + first.stderr
    second = run_cli(*audit, "--json", "--html", str(html))
    assert second.exit_code == 3, second.stdout + second.stderr
    drift = second.json()["drift"]

    # Nothing changed on the targets: no finding is new, resolved or changed against them.
    assert _changes(drift) == set(), drift
    change = drift["policy_change"]
    assert [ref["source"] for ref in change["from"]] == ["policy.example.yaml"]
    assert change["to"]["source"] == "built-in default" and change["known"]
    assert change["from"][0]["sha256"] == first.json()["run"]["args"]["policy_sha256"]
    assert change["to"]["sha256"] != change["from"][0]["sha256"]
    assert _changes(change) == {
        ("new_findings", "train", "GPU_NOT_VISIBLE"), ("new_findings", "infer", "GPU_NOT_VISIBLE"),
        ("resolved_findings", "infer", "EXTENSION_MISSING"),  # required by the example only
        ("severity_changed", "train", "EXTENSION_MISSING"),  # error on `training` in the example
    }

    # The text report, `audit diff` and the dashboard say the same.
    shown = run_cli("audit", "show", "last", "--db", str(db))
    assert f"drift since run {first.json()['run']['id']}: none on the targets\n" in shown.stdout
    assert re.search(r"^policy changed since run \d+: policy\.example\.yaml \(sha256 [0-9a-f]{12}…\) -> "
                     r"built-in default \(sha256 [0-9a-f]{12}…\); 4 finding change\(s\) by the policy alone",
                     shown.stdout, re.MULTILINE), shown.stdout
    diff = run_cli("audit", "diff", "1", "2", "--db", str(db), "--json")
    assert diff.exit_code == 0, diff.stderr
    assert _changes(diff.json()) == set() and _changes(diff.json()["policy_change"]) == _changes(change)
    assert "policy changed since run 1" in run_cli("audit", "diff", "1", "2", "--db", str(db)).stdout
    page = html.read_text()
    assert "No change on the targets since run 1." in page
    assert re.search(r"policy changed:</strong> <span class=\"mono\">policy\.example\.yaml \(sha256 ", page)
    assert "By the policy alone, not counted above: 2 new, 1 resolved, 1 changed finding(s)." in page

    # The same policy again: nothing to say about it, the drift is as it always was.
    third = run_cli(*audit, "--json")
    assert third.json()["drift"]["policy_change"] is None and _changes(third.json()["drift"]) == set()
    assert "policy changed" not in run_cli("audit", "show", "last", "--db", str(db)).stdout
