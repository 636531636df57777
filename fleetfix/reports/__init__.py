"""Every report format, in one registry that every command renders through.

A format renders run objects (a probe, an exec, an apply, an audit, ...) to text: printed on stdout (the
default `text`, or `--json`), or written to the file given to its option (`--html FILE`). Each run object
names its kind (`report_kind`), and a command offers exactly the formats that render the kind it produces
(`formats_for`). So a new format is one module with its render function plus one line in `FORMATS`, and
every command producing what it renders gains its option.

Renderers are named, not imported: listing the formats (as `--help` and every command's options do) costs
no import of the audit, probe or playbook code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

AUDITS = frozenset({"audit"})


@dataclass(frozen=True)
class ReportFormat:
    name: str  # also its option: --NAME (a flag for stdout formats, --NAME FILE for file formats)
    help: str
    renderer: str  # "module:function", called as function(run, **options) -> str
    kinds: frozenset[str] | None = None  # the run kinds it renders; None: every kind
    to_file: bool = False  # written to the FILE its option names, else printed on stdout
    # Whether it shows the targets' facts: loading 10,000 targets' facts from the audit history is most of
    # the cost of `audit show`, so the audit commands load them only for a format that shows them.
    facts: bool = False

    def renders(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def render(self, run: Any, **options: Any) -> str:
        module, _, function = self.renderer.partition(":")
        rendered: str = getattr(importlib.import_module(module), function)(run, **options)
        return rendered


TEXT = ReportFormat("text", "What a person reads (the default).", "fleetfix.reports.text:render_text")
FORMATS: tuple[ReportFormat, ...] = (
    TEXT,
    ReportFormat("json", "Machine-readable output.", "fleetfix.reports.json:render_json", facts=True),
    ReportFormat("html", "Write an HTML page.", "fleetfix.reports.audit:html", AUDITS, True, facts=True),
    ReportFormat("junit", "Write JUnit XML.", "fleetfix.reports.audit:junit", AUDITS, True),
    ReportFormat("prometheus", "Write node_exporter textfile metrics (atomically).",
                 "fleetfix.reports.audit:prometheus", AUDITS, True),
)


def formats_for(kind: str) -> list[ReportFormat]:
    """The formats that render runs of this kind, in registry order."""
    return [report_format for report_format in FORMATS if report_format.renders(kind)]


def write_report(path: str, text: str) -> None:
    """A report file, replaced atomically: a reader (a web server, node_exporter) sees old or new."""
    from fleetfix.audit.report import write_atomic

    write_atomic(path, text)


__all__ = ["FORMATS", "TEXT", "ReportFormat", "formats_for", "write_report"]
