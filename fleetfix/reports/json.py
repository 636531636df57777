"""Machine-readable output: the same data as the text report, as JSON on stdout.

Run objects say what they are as JSON (`to_json()`); the audit's runs are rendered by the audit report,
which also serves the other audit formats.
"""

from __future__ import annotations

import json
from functools import singledispatch
from typing import Any

from fleetfix.audit import AuditRun, RemediatedAudit
from fleetfix.audit import report as audit_report


def render_json(run: Any, **options: Any) -> str:
    return json.dumps(as_json(run), indent=2, sort_keys=False, default=str) + "\n"


@singledispatch
def as_json(run: Any) -> Any:
    to_json = getattr(run, "to_json", None)
    if to_json is None:
        raise TypeError(f"no JSON report for {type(run).__name__}")
    return to_json()


@as_json.register
def _audit(run: AuditRun) -> Any:
    return audit_report.json_report(run)


@as_json.register
def _remediated(run: RemediatedAudit) -> Any:
    return {**audit_report.json_report(run.final), "audit": audit_report.json_report(run.audit)}
