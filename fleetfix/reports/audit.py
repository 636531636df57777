"""The audit's file formats. After `audit --remediate`, a file shows the state afterwards: what monitoring
must see (the terminal and JSON show the audit and the re-probe both).

Each returns its text in pieces, written to the file as they come (write_report): a large fleet's JUnit
file alone, held whole, would set the audit's peak memory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleetfix.audit import AuditRun, RemediatedAudit, report


def _state(run: AuditRun | RemediatedAudit) -> AuditRun:
    return run.final if isinstance(run, RemediatedAudit) else run


def html(run: AuditRun | RemediatedAudit, **options: Any) -> Iterable[str]:
    return report.html_pieces(_state(run))


def junit(run: AuditRun | RemediatedAudit, **options: Any) -> Iterable[str]:
    return report.junit_pieces(_state(run))


def prometheus(run: AuditRun | RemediatedAudit, **options: Any) -> Iterable[str]:
    return report.prometheus_pieces(_state(run))
