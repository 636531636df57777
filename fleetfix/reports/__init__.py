"""Every report format, in one registry that every command renders through.

A format renders run objects (a probe, an exec, an apply, an audit, ...) to text: printed on stdout (the
default `text`, or `--json`), or written to the file given to its option (`--html FILE`). A renderer
returns the text whole or as an iterable of pieces, written as they come: a large report (a big fleet's
JUnit file runs to tens of MB) is then never whole in memory. Each run object
names its kind (`report_kind`), and a command offers exactly the formats that render the kind it produces
(`formats_for`). So a new format is one module with its render function plus one line in `FORMATS`, and
every command producing what it renders gains its option.

Renderers are named, not imported: listing the formats (as `--help` and every command's options do) costs
no import of the audit, probe or playbook code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# A format's need for the targets' facts (ReportFormat.facts): none (False), all of them (True), or a
# projection: what it shows of each target's facts, computed as they are loaded. The same type as
# fleetfix.audit.model.FactsNeed (what load_audit takes), spelled again: importing the audit here would
# cost every command that lists its formats.
FactsProjection = Callable[[dict[str, Any]], dict[str, Any]]
FactsNeed = bool | FactsProjection

AUDITS = frozenset({"audit"})


@dataclass(frozen=True)
class ReportFormat:
    name: str  # also its option: --NAME (a flag for stdout formats, --NAME FILE for file formats)
    help: str
    renderer: str  # "module:function", called as function(run, **options) -> str | Iterable[str]
    kinds: frozenset[str] | None = None  # the run kinds it renders; None: every kind
    to_file: bool = False  # written to the FILE its option names, else printed on stdout
    # Which of the targets' facts it shows: loading 10,000 targets' facts from the audit history is most of
    # the cost of `audit show` (and ~115 MB), so the audit commands load them only for a format that shows
    # them. False: none; True: all; "module:function": a projection of each target's facts to the few
    # it shows (the HTML report's version matrix), named so that listing formats imports nothing.
    facts: bool | str = False
    # A file format a collector running as another user reads (node_exporter): its `--NAME-group GROUP`
    # option makes the file 0640 with that group instead of 0600.
    group: bool = False

    @property
    def module(self) -> str:
        """The module its renderer lives in (for fleetfix.importahead)."""
        return self.renderer.partition(":")[0]

    def renders(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def pieces(self, run: Any, **options: Any) -> Iterable[str]:
        """The report's text, whole or in pieces (in order; joined, they are the text)."""
        rendered: str | Iterable[str] = _named(self.renderer)(run, **options)
        return (rendered,) if isinstance(rendered, str) else rendered

    def render(self, run: Any, **options: Any) -> str:
        return "".join(self.pieces(run, **options))


def _named(name: str) -> Any:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def facts_needed(formats: Iterable[ReportFormat]) -> FactsNeed:
    """What the facts must hold for all these formats: all of them when one shows all, or when two
    project differently (all holds what every projection keeps); else the one projection; else none."""
    needs = {report_format.facts for report_format in formats if report_format.facts is not False}
    if not needs:
        return False
    if True in needs or len(needs) > 1:
        return True
    [name] = needs
    projection: FactsProjection = _named(str(name))
    return projection


TEXT = ReportFormat("text", "What a person reads (the default).", "fleetfix.reports.text:render_text")
FORMATS: tuple[ReportFormat, ...] = (
    TEXT,
    ReportFormat("json", "Machine-readable output.", "fleetfix.reports.json:render_json", facts=True),
    ReportFormat("html", "Write an HTML page.", "fleetfix.reports.audit:html", AUDITS, True,
                 facts="fleetfix.audit.dashboard:matrix_facts"),
    ReportFormat("junit", "Write JUnit XML.", "fleetfix.reports.audit:junit", AUDITS, True),
    ReportFormat("prometheus", "Write node_exporter textfile metrics (atomically).",
                 "fleetfix.reports.audit:prometheus", AUDITS, True, group=True),
)


def formats_for(kind: str) -> list[ReportFormat]:
    """The formats that render runs of this kind, in registry order."""
    return [report_format for report_format in FORMATS if report_format.renders(kind)]


def write_report(path: str, text: str | Iterable[str], *, group: int | None = None,
                 group_option: str = "") -> None:
    """A report file, replaced atomically: a reader (a web server, node_exporter) sees old or new. The
    text may come in pieces (ReportFormat.pieces), each written as it comes. 0600, or 0640 with a group
    (from the option group_option)."""
    from fleetfix.audit.report import write_atomic

    write_atomic(path, text, group=group, group_option=group_option)


__all__ = ["FORMATS", "TEXT", "FactsNeed", "FactsProjection", "ReportFormat", "facts_needed", "formats_for",
           "write_report"]
