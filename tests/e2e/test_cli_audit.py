"""The nightly audit on the test bed: a container broken between two audits shows as drift, then resolved."""

from __future__ import annotations

import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import healthy
from tests.lab.aptrepo import AptRepo
from tests.lab.bed import Lab
from tests.lab.container import Container


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
