"""The audit's file formats. After `audit --remediate`, a file shows the state afterwards: what monitoring
must see (the terminal and JSON show the audit and the re-probe both)."""

from __future__ import annotations

from typing import Any

from fleetfix.audit import AuditRun, RemediatedAudit, report


def _state(run: AuditRun | RemediatedAudit) -> AuditRun:
    return run.final if isinstance(run, RemediatedAudit) else run


def html(run: AuditRun | RemediatedAudit, **options: Any) -> str:
    return report.html_report(_state(run))


def junit(run: AuditRun | RemediatedAudit, **options: Any) -> str:
    return report.junit_report(_state(run))


def prometheus(run: AuditRun | RemediatedAudit, **options: Any) -> str:
    return report.prometheus_report(_state(run))
