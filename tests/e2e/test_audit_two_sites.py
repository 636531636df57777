"""Two controllers audit two sites of the test bed into one PostgreSQL history at the same time, two
nights: each site's drift is its own, one history shows both, each site's dashboard its own. (Text
history, --site filters, prune, a killed connection: tests/unit/audit/test_audit_sites.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.conftest import REPO, host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.pgserver import PgServer


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
