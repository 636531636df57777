"""Two controllers audit two sites of the test bed into one PostgreSQL history at the same time, two
nights: each site's drift is its own, one history shows both, each site's dashboard its own, and one
dashboard shows both sites, each with its own drift. (Text
history, --site filters, prune, a killed connection: tests/unit/audit/test_audit_sites.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetfix.audit import AuditStore, load_audit
from fleetfix.audit.dashboard import build_sites_dashboard, matrix_facts
from tests.e2e.conftest import REPO, host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.pgserver import PgServer
from tests.unit.audit.audit_testkit import assert_versions_agree_with_problems


def test_two_controllers_audit_two_sites_into_one_postgresql_history(
    lab: Lab, make_ct: Callable[..., Container], pg_server: PgServer, tmp_path: Path,
) -> None:
    url = pg_server.fresh_url()
    cts = {"east": make_ct(), "west": make_ct()}

    def night() -> dict[str, tuple[int, dict[str, Any]]]:
        """Both controllers' audits, started together (a schedule firing at the same minute): each
        site's exit code and JSON report."""
        children = {
            site: subprocess.Popen(
                [sys.executable, "-m", "fleetfix", "audit", *host_args(lab, None, ct.ctid), "--db", url,
                 "--site", site, "--controller", f"ctl-{site}", "--json", "--html",
                 str(tmp_path / f"{site}.html")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                env={**os.environ, "NO_COLOR": "1"})
            for site, ct in cts.items()}
        done = {}
        for site, child in children.items():
            out, err = child.communicate(timeout=240)
            assert child.returncode in (0, 3), (site, out, err)
            done[site] = (child.returncode, json.loads(out))
        return done

    night()
    cts["east"].sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
    second = night()
    (east_code, east), (west_code, west) = second["east"], second["west"]
    assert (east_code, west_code) == (3, 0)
    assert [(c["target"].rsplit("/", 1)[1], c["code"]) for c in east["drift"]["new_findings"]] == [
        (str(cts["east"].ctid), "DPKG_INTERRUPTED")]
    assert west["drift"]["new_findings"] == [] and west["drift"]["resolved_findings"] == []
    east_html, west_html = (tmp_path / "east.html").read_text(), (tmp_path / "west.html").read_text()
    assert "DPKG_INTERRUPTED" in east_html and "at site east" in east_html
    assert "DPKG_INTERRUPTED" not in west_html and "at site west" in west_html

    history = run_cli("audit", "history", "--db", url, "--json").json()
    assert {r["status"] for r in history} == {"complete"}
    assert sorted((r["site"], r["controller"]) for r in history) == [("east", "ctl-east")] * 2 + [
        ("west", "ctl-west")] * 2

    # One dashboard for both sites: each site's newest run, its drift against its own previous run.
    page_path = tmp_path / "sites.html"
    shown = run_cli("audit", "show", "last", "--db", url, "--html", str(page_path))
    assert shown.exit_code in (0, 3), shown.stderr
    page = page_path.read_text()
    assert '<option value="east">' in page and '<option value="west">' in page
    east_drift = page[page.index('id="drift-s1"'):page.index('id="drift-s2"')]
    west_drift = page[page.index('id="drift-s2"'):page.index('<section id="fleet"')]
    assert "Site east" in east_drift and "DPKG_INTERRUPTED" in east_drift and "1 new" in east_drift
    assert "Site west" in west_drift and "No change since run" in west_drift
    for site, ct in cts.items():
        assert f'data-site="{site}"' in page and f"/{ct.ctid}" in page
    with AuditStore(url, readonly=True) as store:
        dash = build_sites_dashboard([load_audit(store, run_id, facts=matrix_facts)
                                      for run_id in store.newest_per_site()])
    assert [(s.site, s.controller) for s in dash.sites] == [("east", "ctl-east"), ("west", "ctl-west")]
    assert_versions_agree_with_problems(dash)
