"""A recorded audit run with nothing that varies between test runs, and the report files it gives.

The golden files under golden/ were written by the renderers as they were before the reports were
streamed (issue 21: each file whole in memory as one text); the streamed renderers must give the same
bytes. Regenerate only on purpose, when a report's content is meant to change:

    TZ=UTC python tests/unit/audit/report_golden.py
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from audit_testkit import FakeWorld, edited, interrupt_dpkg, make_target

from fleetfix.audit import AuditRun, AuditStore, Policy, TargetResult, load_audit, run_audit
from fleetfix.audit.model import History

GOLDEN = Path(__file__).resolve().parent / "golden"
# format name (fleetfix.reports.FORMATS) -> golden file
FILES = {"html": "report.html", "junit": "report.xml", "prometheus": "report.prom", "json": "report.json",
         "text": "report.txt"}
# The HTML page of a history of two sites (`audit show last --html` without --site).
SITES_FILE = "report-sites.html"

CONTAINERS: dict[int, Any] = {
    200: "healthy", 201: "healthy", 202: "problem_case", 203: "stopped", 204: "toolkit_13_vs_cu128",
    205: "debian13_cu128_problem", 206: "apt_trouble", 207: "toolkit_12_4", 208: "local_debian12_nvcc13",
}


def recorded_audit(directory: Path, *, facts: Any = True, containers: dict[int, Any] = CONTAINERS,
                   node: str = "pve1", broken: int = 201) -> AuditRun:
    """Night 2 of a small fleet (one container newly broken, one stopped, a code the policy ignores,
    a hostile target name and error), loaded from the history with `facts` as load_audit takes it; the
    times and durations (which the clock sets) replaced by fixed ones."""
    world = FakeWorld(dict(containers))
    targets = [make_target(node, n) for n in containers]
    policy = Policy(severity={"EXTENSION_MISSING": "ignore"})
    with AuditStore(directory / "golden.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=policy, store=store, facts=False)
        world.cts[broken] = edited("healthy", interrupt_dpkg)
        second = run_audit(fleet, targets, policy=policy, store=store, facts=False)
        run = load_audit(store, second.info.id, facts=facts)
    hostile = TargetResult("pve9/3\x1b[2K\u202e<b>x</b>", "pve9", 3, "unreachable",
                           error="refused\r\nok: all healthy <script>")
    results = tuple(dataclasses.replace(result, duration=0.25 + i / 100)
                    for i, result in enumerate((*run.targets, hostile)))
    info = dataclasses.replace(run.info, started=1_767_225_600.0, finished=1_767_225_612.5, duration=12.5)
    trend = tuple(dataclasses.replace(point, started=1_767_139_200.0 + 86_400 * i)
                  for i, point in enumerate(run.history.trend))
    since = dict.fromkeys(run.history.since, 1_767_139_200.0)
    stored = dataclasses.replace(run.run, info=info, targets=results)
    return AuditRun(stored, run.drift, History(trend, since))


def two_site_audit(directory: Path, *, facts: Any = True) -> AuditRun:
    """recorded_audit's night at site east and, at site west, another fleet's (the same target name
    pve1/200 among them, its own night-2 breakage), as `audit show last` loads them for one page."""
    sites = []
    west = {200: "toolkit_12_4", 300: "healthy", 301: "problem_case"}
    for site, containers, broken in (("east", CONTAINERS, 201), ("west", west, 300)):
        (directory / site).mkdir(parents=True)
        run = recorded_audit(directory / site, facts=facts, containers=containers, broken=broken)
        info = dataclasses.replace(run.info, site=site, controller=f"ctl-{site}",
                                   started=run.info.started + (3600 if site == "west" else 0))
        sites.append(dataclasses.replace(run, run=dataclasses.replace(run.run, info=info)))
    return dataclasses.replace(sites[-1], sites=tuple(sites))


def main() -> int:
    os.environ["TZ"] = "UTC"
    time.tzset()
    from fleetfix.reports import FORMATS

    formats = {report_format.name: report_format for report_format in FORMATS}
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = recorded_audit(Path(tmp))
        sites = two_site_audit(Path(tmp) / "sites")
    for name, filename in FILES.items():
        (GOLDEN / filename).write_bytes(formats[name].render(run).encode("utf-8"))
        print(f"wrote {GOLDEN / filename}")
    (GOLDEN / SITES_FILE).write_bytes(formats["html"].render(sites).encode("utf-8"))
    print(f"wrote {GOLDEN / SITES_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
