"""Two controllers audit two sites of the test bed into one PostgreSQL history at the same time, night
after night: each site's drift is its own, one history and one dashboard per site show them all."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.e2e.conftest import REPO, host_args, run_cli
from tests.lab.bed import Lab
from tests.lab.container import Container
from tests.lab.pgserver import PgServer


def test_two_controllers_audit_two_sites_into_one_postgresql_history(
    lab: Lab, make_ct: Callable[..., Container], pg_server: PgServer, tmp_path: Path,
) -> None:
    url = pg_server.fresh_url()
    cts = {"east": make_ct(), "west": make_ct()}

    def night() -> dict[str, int]:
        """Both controllers' audits, started together (a schedule firing at the same minute)."""
        children = {
            site: subprocess.Popen(
                [sys.executable, "-m", "fleetfix", "audit", *host_args(lab, None, ct.ctid), "--db", url,
                 "--site", site, "--controller", f"ctl-{site}", "--json", "--html",
                 str(tmp_path / f"{site}.html")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                env={**os.environ, "NO_COLOR": "1"})
            for site, ct in cts.items()}
        codes = {}
        for site, child in children.items():
            out, err = child.communicate(timeout=240)
            assert child.returncode in (0, 3), (site, out, err)
            codes[site] = child.returncode
        return codes

    night()
    cts["east"].sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
    assert night() == {"east": 3, "west": 0}
    east = run_cli("audit", "show", "last", "--db", url, "--site", "east", "--json").json()
    west = run_cli("audit", "show", "last", "--db", url, "--site", "west", "--json").json()
    assert "DPKG_INTERRUPTED" in str(east["drift"]["new_findings"])
    assert west["drift"]["new_findings"] == [] and west["drift"]["resolved_findings"] == []
    assert "DPKG_INTERRUPTED" in (tmp_path / "east.html").read_text()
    assert "DPKG_INTERRUPTED" not in (tmp_path / "west.html").read_text()

    cts["east"].sh("rm -f /var/lib/dpkg/updates/0001")
    night()
    east = run_cli("audit", "show", "last", "--db", url, "--site", "east", "--json").json()
    assert "DPKG_INTERRUPTED" in str(east["drift"]["resolved_findings"])

    history = run_cli("audit", "history", "--db", url, "--json").json()
    assert len(history) == 6 and {r["status"] for r in history} == {"complete"}
    assert sorted((r["site"], r["controller"]) for r in history) == [("east", "ctl-east")] * 3 + [
        ("west", "ctl-west")] * 3
    text = run_cli("audit", "history", "--db", url).stdout
    assert "SITE" in text and "ctl-west" in text and "password" not in text
