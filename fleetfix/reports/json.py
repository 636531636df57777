"""Machine-readable output: the same data as the text report, as JSON on stdout.

Run objects say what they are as JSON (`to_json()`); the audit's runs are rendered by the audit report,
which also serves the other audit formats.
"""

from __future__ import annotations

import json
from typing import Any


def render_json(run: Any, **options: Any) -> str:
    return json.dumps(as_json(run), indent=2, sort_keys=False, default=str) + "\n"


def as_json(run: Any) -> Any:
    # The audit's runs by class name: importing fleetfix.audit to compare types would cost every other
    # command's --json ~0.2 s (issue 21). Subclasses count, as with isinstance.
    names = {cls.__name__ for cls in type(run).__mro__}
    if "AuditRun" in names or "RemediatedAudit" in names:
        from fleetfix.audit import report as audit_report

        if "RemediatedAudit" in names:
            return {**audit_report.json_report(run.final), "audit": audit_report.json_report(run.audit)}
        return audit_report.json_report(run)
    to_json = getattr(run, "to_json", None)
    if to_json is None:
        raise TypeError(f"no JSON report for {type(run).__name__}")
    return to_json()
