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

CONTAINERS: dict[int, Any] = {
    200: "healthy", 201: "healthy", 202: "problem_case", 203: "stopped", 204: "toolkit_13_vs_cu128",
    205: "debian13_cu128_problem", 206: "apt_trouble", 207: "toolkit_12_4", 208: "local_debian12_nvcc13",
}


def recorded_audit(directory: Path, *, facts: Any = True) -> AuditRun:
    """Night 2 of a small fleet (one container newly broken, one stopped, a code the policy ignores,
    a hostile target name and error), loaded from the history with `facts` as load_audit takes it; the
    times and durations (which the clock sets) replaced by fixed ones."""
    world = FakeWorld(dict(CONTAINERS))
    targets = [make_target("pve1", n) for n in CONTAINERS]
    policy = Policy(severity={"EXTENSION_MISSING": "ignore"})
    with AuditStore(directory / "golden.db") as store, world.fleet() as fleet:
        run_audit(fleet, targets, policy=policy, store=store, facts=False)
        world.cts[201] = edited("healthy", interrupt_dpkg)
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


def main() -> int:
    os.environ["TZ"] = "UTC"
    time.tzset()
    from fleetfix.reports import FORMATS

    formats = {report_format.name: report_format for report_format in FORMATS}
    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = recorded_audit(Path(tmp))
    for name, filename in FILES.items():
        (GOLDEN / filename).write_bytes(formats[name].render(run).encode("utf-8"))
        print(f"wrote {GOLDEN / filename}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
