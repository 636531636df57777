"""The terminal report of every run object: what a person reads after a command.

One function per run type behind `render_text`: a new run type registers its own with `@renders("Class")`.
Registered by class name, not by type (singledispatch), so that rendering a probe does not import the
audit, the playbook runner and jinja2 to register their renderers, on every command. Everything that
came from a target is printed as text, never as rich markup, so nothing a target
says can style (or break) the terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetfix.reports.console import SEVERITY_STYLE, STATUS_STYLE, page, page_text, print_table
from fleetfix.secrets import mask_vars
from fleetfix.terminal import safe

if TYPE_CHECKING:
    from fleetfix.audit import AuditHistory, AuditRun, RemediatedAudit
    from fleetfix.audit.drift import Drift
    from fleetfix.command import ExecRun
    from fleetfix.inventory.resolve import Resolution
    from fleetfix.playbook.records import RunDetail, RunList
    from fleetfix.playbook.runner import PlaybookRun
    from fleetfix.probe.run import ProbeRun, TargetReport

Renderer = TypeVar("Renderer", bound=Callable[..., None])
_RENDERERS: dict[str, Callable[..., None]] = {}


def renders(class_name: str) -> Callable[[Renderer], Renderer]:
    """Register the text report of the run objects of class `class_name` (or of a subclass)."""

    def register(function: Renderer) -> Renderer:
        _RENDERERS[class_name] = function
        return function

    return register


def _shown(text: str) -> str:
    """Text from a target, as rich shows it: control sequences escaped visibly (fleetfix.terminal), then
    rich's markup escaped."""
    return escape(safe(text))


def render_text(run: Any, **options: Any) -> str | Iterator[str]:
    """The terminal report of run, laid out (and coloured) like stdout."""
    if "AuditRun" in {cls.__name__ for cls in type(run).__mro__}:  # by name: see reports.json.as_json
        return _audit_pieces(run, **options)
    out = page()
    show(run, out, **options)
    return page_text(out)


def show(run: Any, out: Console, **options: Any) -> None:
    for cls in type(run).__mro__:
        if cls.__name__ in _RENDERERS:
            _RENDERERS[cls.__name__](run, out, **options)
            return
    raise TypeError(f"no text report for {type(run).__name__}")


@renders("Resolution")
def _targets(resolution: Resolution, out: Console, **options: Any) -> None:
    table = Table("TARGET", "NODE", "ADDRESS", "GUEST", "TAGS", "GROUPS", "VARS", "SOURCE", box=None,
                  pad_edge=False)
    for t in resolution.targets:
        ssh = t.node.ssh
        address = f"{ssh.user}@{ssh.address}:{ssh.port}" if ssh else "(local)"
        guest = "-" if t.guest.is_node else f"{t.guest.kind} {t.guest.id}"  # "lxc 200", "vm 300"
        table.add_row(*(_shown(cell) for cell in (
            t.name, t.node.name, address, guest, ",".join(sorted(t.tags)),
            ",".join(sorted(t.groups)), _vars_cell(t.vars), t.source,
        )))
    print_table(table, out)
    for label, reason in resolution.skipped:
        out.print(f"skipped: {_shown(label)}: {_shown(reason)}")
    skipped = f", {len(resolution.skipped)} skipped" if resolution.skipped else ""
    out.print(f"{len(resolution.targets)} target(s){skipped}")


def _vars_cell(variables: Mapping[str, Any]) -> str:
    """A target's resolved vars, one `name=value` a line (strings as written, the rest as JSON), with
    secret-named vars masked: a listing is pasted into tickets and chats."""
    lines = []
    for name, value in mask_vars(variables).items():
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        lines.append(f"{name}={shown}")
    return "\n".join(lines) or "-"


@renders("ExecRun")
def _exec(run: ExecRun, out: Console, *,
          transcripts: Mapping[str, Sequence[tuple[str, str]]] | None = None, **options: Any) -> None:
    """Each target's header, then its stdout (its stderr was streamed live as it came), or, given its
    transcript (on a terminal), everything it printed, in order."""
    for outcome in run.outcomes:
        result = outcome.value
        if result is None:
            message = outcome.error.with_hint() if outcome.error else outcome.status
            out.print(f"[bold]== {_shown(outcome.target.name)}[/] [red]{outcome.status}[/]: "
                      f"{_shown(message)}")
        else:
            state = "timed out" if result.timed_out else f"exit {result.exit_code}"
            colour = "green" if result.ok else "red"
            out.print(f"[bold]== {_shown(outcome.target.name)}[/] [{colour}]{state}[/]")
        if transcripts is not None:
            # As the command wrote it (stderr too: it is one screen), never as markup.
            out.file.write("".join(safe(line) + "\n" for _, line in transcripts.get(outcome.target.name, ())))
        elif result is not None and result.stdout:  # as written when piped; on a terminal, escaped
            stdout = safe(result.stdout) if out.is_terminal else result.stdout
            out.file.write(stdout if stdout.endswith("\n") else stdout + "\n")


def _fact_lines(report: TargetReport) -> list[tuple[str, str]]:
    facts = report.facts
    if facts is None:
        return []
    data = facts.model_dump(mode="json")
    os_ = data.get("os") or {}
    torch = data.get("torch") or {}
    cuda = data.get("cuda") or {}
    apt = data.get("apt") or {}
    gpu = data.get("gpu") or {}
    toolkits = ", ".join(f"{tk['version']} ({tk['path']})" for tk in cuda.get("toolkits") or []) or "none"
    lines = [
        ("os", f"{os_.get('id')} {os_.get('version_id')} {os_.get('machine')} -> NVIDIA repo "
               f"{os_.get('nvidia_distro') or 'unsupported'}/{os_.get('nvidia_arch') or '-'}"),
        ("torch", f"{torch.get('version')} (CUDA {torch.get('cuda')})" if torch else "not found"),
        ("nvcc", toolkits),
        ("nvidia repo", "configured" if apt.get("nvidia_repo_configured") else "not configured"),
        ("gpu", f"driver {gpu.get('driver_version') or 'none'}; "
                f"{', '.join(gpu.get('names') or []) or 'no GPU'}"),
    ]
    if report.node and report.node.kernel_module_version:
        lines.append(("host module", report.node.kernel_module_version))
    return lines


def _health(report: TargetReport) -> str:
    return report.worst if report.status == "ok" else report.status


@renders("ProbeRun")
def _probe(run: ProbeRun, out: Console, **options: Any) -> None:
    for report in run.reports:
        health = _health(report)
        lines = [f"[bold]== {_shown(report.target.name)}[/] "
                 f"[{SEVERITY_STYLE.get(health, 'red')}]{health}[/] ({report.duration:.2f}s)"]
        if report.error:
            lines.append(f"   [red]{_shown(report.error.with_hint())}[/]")
        lines += [f"   {key:<12} {_shown(value)}" for key, value in _fact_lines(report)]
        for finding in report.findings:
            severity = str(finding.severity.value)
            lines.append(f"   [{SEVERITY_STYLE[severity]}]{severity.upper():<7}[/] "
                         f"[bold]{finding.code}[/]: {_shown(finding.summary)}")
            if finding.fix is not None:
                lines.append(f"            fix: {_shown(finding.fix.text())}")
        # One print per target, its blank line included, not one per line: rich's own cost per print
        # was a tenth of the report's rendering, for the same text.
        out.print("\n".join(lines) + "\n")
    if len(run.reports) > 1:
        _probe_summary_table(run, out)


def _probe_summary_table(run: ProbeRun, out: Console) -> None:
    table = Table("TARGET", "HEALTH", "TORCH CUDA", "NVCC", "FINDINGS", box=None, pad_edge=False)
    for report in run.reports:
        health = _health(report)
        torch = report.facts.torch if report.facts else None
        toolkits = report.facts.cuda.toolkits if report.facts else []
        codes = ", ".join(f.code for f in report.findings) or (str(report.error) if report.error else "-")
        table.add_row(
            _shown(report.target.name), f"[{SEVERITY_STYLE.get(health, 'red')}]{health}[/]",
            torch.cuda if torch and torch.cuda else "-",
            ", ".join(str(tk.version) for tk in toolkits) or "-", _shown(codes),
        )
    print_table(table, out)
    counts = ", ".join(f"{n} {k}" for k, n in run.summary().items())
    out.print(f"{len(run.reports)} target(s): {counts}")


@renders("PlaybookRun")
def _apply(run: PlaybookRun, out: Console, **options: Any) -> None:
    for target_run in run.targets:
        if target_run.status in ("failed", "unreachable"):
            failed = [s for s in target_run.steps if s.status == "failed"]
            reason = target_run.reason or (failed[0].reason if failed else "")
            if target_run.error is not None and target_run.error.hint:
                reason = f"{reason} — {target_run.error.hint}"
            out.print(f"[bold red]{target_run.status}[/] {_shown(target_run.target)}: {_shown(reason)}")
            for step in failed[:1]:
                for line in (step.stdout + step.stderr).rstrip().splitlines()[-15:]:
                    out.print(f"    {_shown(line)}")
        snapshot = target_run.snapshot
        if snapshot is not None:
            if snapshot.rolled_back:
                out.print(f"[yellow]rolled back[/] {_shown(target_run.target)} "
                          f"to {_shown(str(snapshot.name))}")
            elif snapshot.rollback_error is not None:
                out.print(f"[bold red]rollback failed[/] {_shown(target_run.target)}: "
                          f"{_shown(snapshot.rollback_error)} (snapshot {_shown(str(snapshot.name))} kept)")
            for warning in snapshot.warnings:
                out.print(f"[yellow]warning[/] {_shown(target_run.target)}: {_shown(warning)}")
    if run.aborted:
        out.print(f"[bold red]aborted[/]: {_shown(run.aborted)}")
    if run.error:
        out.print(f"[bold red]error[/]: {_shown(str(run.error))}")
    title = "CHECK RECAP" if run.check else "PLAY RECAP"
    out.print(f"\n[bold]{title}[/] {_shown(run.playbook)} ({run.duration:.1f}s, run {run.run_id})")
    for line in run.recap_lines():
        out.print(_shown(line))


@renders("RunList")
def _runs(run_list: RunList, out: Console, **options: Any) -> None:
    if not run_list.runs:
        out.print("no runs recorded")
        return
    table = Table("RUN", "STARTED", "PLAYBOOK", "MODE", "STATUS", "TARGETS", box=None, pad_edge=False)
    for run in run_list.runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started)) if run.started else "-"
        table.add_row(run.run_id, started, _shown(run.playbook), "check" if run.check else "apply",
                      f"[{STATUS_STYLE.get(run.status, '')}]{run.status}[/]", str(len(run.targets)))
    print_table(table, out)


@renders("RunDetail")
def _run_detail(detail: RunDetail, out: Console, **options: Any) -> None:
    summary = detail.summary
    out.print(f"[bold]run {summary.run_id}[/] {_shown(summary.playbook)} "
              f"{'check' if summary.check else 'apply'}: {summary.status}")
    for record in detail.targets.values():
        out.print(f"\n[bold]== {_shown(record.name)}[/] "
                  f"[{STATUS_STYLE.get(record.status, '')}]{record.status}[/] {_shown(record.reason)}")
        if record.snapshot is not None:  # the way back comes before the steps that made it needed
            if record.snapshot.note():
                out.print(f"  {_shown(record.snapshot.note())}")
            if record.snapshot.pruned:
                out.print(f"  pruned {_shown(', '.join(record.snapshot.pruned))}")
            for warning in record.snapshot.warnings:
                out.print(f"  [yellow]warning[/] {_shown(warning)}")
        for step in record.steps:
            out.print(f"  [{STATUS_STYLE.get(step.status, '')}]{step.status:<12}[/] {_shown(step.name)}"
                      + (f" — {_shown(step.reason)}" if step.reason else ""))
            for script in step.scripts:
                rc = "running/lost" if script.rc is None else f"rc={script.rc}"
                out.print(f"      {script.phase} #{script.attempt} {rc}")
                for line in (script.stdout + script.stderr).rstrip().splitlines()[-20:]:
                    out.print(f"        {_shown(line)}")


# --- audit: plain text (it goes to cron mail and journals as often as to terminals) ---------------------

def _audit_pieces(run: AuditRun, *, verbose: bool = False, **options: Any) -> Iterator[str]:
    """An audit's text a line at a time, not through a page: plain text (no rich layout), and a large
    fleet's whole text with its copies (page, safe) would set the command's peak memory. safe() escapes
    character by character, so line by line is the same text."""
    from fleetfix.audit import report as audit_report

    return (safe(line) for line in audit_report.text_pieces(run, verbose=verbose))


@renders("RemediatedAudit")
def _remediated(run: RemediatedAudit, out: Console, **options: Any) -> None:
    from fleetfix.audit import report as audit_report

    out.file.write(safe(audit_report.text_report(run.audit) + "\n"
                        + audit_report.remediation_report(run.final)))


@renders("AuditHistory")
def _history(history: AuditHistory, out: Console, **options: Any) -> None:
    if not history.runs:
        out.file.write("no audit runs recorded\n")
        return
    # A history of one site ("default": every history before sites) reads as it always did; with
    # several, each run says where and by whom.
    sites = any(run.site != "default" for run in history.runs)
    lines = [f"{'RUN':>5}  {'STARTED':<19}  {'STATUS':<10}  {'TARGETS':>7}  {'ERROR':>5}  "
             f"{'UNREACH':>7}  " + (f"{'DURATION':<8}  {'SITE':<12}  CONTROLLER" if sites else "DURATION")]
    for run in history.runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        duration = "-" if run.duration is None else f"{run.duration:.1f}s"
        line = (f"{run.id:>5}  {started:<19}  {run.status:<10}  {run.target_count:>7}  "
                f"{run.error_count:>5}  {run.unreachable_count:>7}  {duration}")
        if sites:
            line = f"{line:<73}  {safe(run.site):<12}  {safe(run.controller or '-')}"
        lines.append(line)
    out.file.write("\n".join(lines) + "\n")


@renders("Drift")
def _drift(drift: Drift, out: Console, **options: Any) -> None:
    from fleetfix.audit import report as audit_report

    out.file.write(safe("\n".join(audit_report.drift_lines(drift)) + "\n"))
