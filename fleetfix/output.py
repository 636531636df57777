"""Rendering for the terminal and for machines. rich honours NO_COLOR and plain output off a TTY."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from fleetfix.fleet import Outcome
    from fleetfix.probing import TargetReport
    from fleetfix.target import Target
    from fleetfix.transport.base import CommandResult, OutputSink, Stream

def _console(*, stderr: bool = False) -> Console:
    # Off a terminal rich assumes 80 columns and truncates table cells ("…"): a run id piped to a file
    # could not be copied back into `runs show`. Use the terminal's width, or a wide page when piped.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)


console = _console()
err_console = _console(stderr=True)

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "healthy": "green"}


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def target_json(target: Target) -> dict[str, Any]:
    ssh = target.node.ssh
    return {
        "name": target.name,
        "node": target.node.name,
        "address": ssh.address if ssh else None,
        "port": ssh.port if ssh else None,
        "user": ssh.user if ssh else None,
        "ctid": target.ctid,
        "tags": sorted(target.tags),
        "groups": sorted(target.groups),
        "vars": dict(target.vars),
        "source": target.source,
    }


def render_targets(
    targets: Sequence[Target], *, skipped: Sequence[tuple[str, str]] = (), as_json: bool
) -> None:
    if as_json:
        print_json({"targets": [target_json(t) for t in targets],
                    "skipped": [{"target": label, "reason": reason} for label, reason in skipped]})
        return
    table = Table("TARGET", "NODE", "ADDRESS", "CT", "TAGS", "GROUPS", "SOURCE", box=None, pad_edge=False)
    for t in targets:
        ssh = t.node.ssh
        address = f"{ssh.user}@{ssh.address}:{ssh.port}" if ssh else "(local)"
        table.add_row(*(escape(cell) for cell in (
            t.name, t.node.name, address, str(t.ctid or "-"), ",".join(sorted(t.tags)),
            ",".join(sorted(t.groups)), t.source,
        )))
    console.print(table)
    for label, reason in skipped:
        console.print(f"skipped: {escape(label)}: {escape(reason)}")
    console.print(f"{len(targets)} target(s)" + (f", {len(skipped)} skipped" if skipped else ""))


def render_exec(outcomes: Sequence[Outcome[CommandResult]], *, as_json: bool) -> None:
    if as_json:
        print_json([_exec_json(o) for o in outcomes])
        return
    for outcome in outcomes:
        result = outcome.value
        if result is None:
            console.print(f"[bold]== {escape(outcome.target.name)}[/] [red]{outcome.status}[/]: "
                          f"{escape(str(outcome.error))}")
            continue
        state = "timed out" if result.timed_out else f"exit {result.exit_code}"
        colour = "green" if result.ok else "red"
        console.print(f"[bold]== {escape(outcome.target.name)}[/] [{colour}]{state}[/]")
        if result.stdout:
            sys.stdout.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
            sys.stdout.flush()
        if result.stderr:
            sys.stderr.write(result.stderr if result.stderr.endswith("\n") else result.stderr + "\n")
            sys.stderr.flush()


def _exec_json(outcome: Outcome[CommandResult]) -> dict[str, Any]:
    result = outcome.value
    return {
        "target": outcome.target.name,
        "status": outcome.status if result is None else ("ok" if result.ok else "failed"),
        "error": None if outcome.error is None else str(outcome.error),
        "exit_code": None if result is None else result.exit_code,
        "timed_out": None if result is None else result.timed_out,
        "stdout": None if result is None else result.stdout,
        "stderr": None if result is None else result.stderr,
        "duration": round(outcome.duration, 3),
    }


class ProbeProgress:
    """A progress bar on stderr while targets are probed; silent off a TTY or for --json."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._progress: Progress | None = None
        if enabled and total > 1 and err_console.is_terminal:
            self._progress = Progress(
                TextColumn("probing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"), console=err_console, transient=True,
            )
            self._task = self._progress.add_task("", total=total)

    def __enter__(self) -> ProbeProgress:
        if self._progress:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress:
            self._progress.stop()

    def advance(self, report: TargetReport) -> None:
        if self._progress:
            self._progress.update(self._task, advance=1, description=report.target.name)


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


def render_probe(reports: Sequence[TargetReport], *, as_json: bool) -> None:
    if as_json:
        print_json({"targets": [r.to_json() for r in reports], "summary": _summary(reports)})
        return
    for report in reports:
        health = report.worst if report.status == "ok" else report.status
        console.print(f"[bold]== {escape(report.target.name)}[/] "
                      f"[{SEVERITY_STYLE.get(health, 'red')}]{health}[/] ({report.duration:.2f}s)")
        if report.error:
            console.print(f"   [red]{escape(report.error)}[/]")
        for key, value in _fact_lines(report):
            console.print(f"   {key:<12} {escape(value)}")
        for finding in report.findings:
            severity = str(finding.severity.value)
            console.print(f"   [{SEVERITY_STYLE[severity]}]{severity.upper():<7}[/] "
                          f"[bold]{finding.code}[/]: {escape(finding.summary)}")
            if finding.fix is not None:
                console.print(f"            fix: {escape(_fix_text(finding))}")
        console.print()
    if len(reports) > 1:
        _render_summary_table(reports)


def _fix_text(finding: Any) -> str:
    fix = finding.fix
    parts = []
    if getattr(fix, "playbook", None):
        extra = " ".join(f"--var {shlex.quote(f'{k}={_var_text(v)}')}" for k, v in (fix.vars or {}).items())
        parts.append(f"fleetfix apply {fix.playbook}" + (f" {extra}" if extra else ""))
    if getattr(fix, "hint", None):
        parts.append(fix.hint)
    return " — ".join(parts)


def _var_text(value: Any) -> str:
    """A var as `--var` takes it: lists comma-separated (build-extensions reads `a,b`)."""
    return ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)


def _summary(reports: Sequence[TargetReport]) -> dict[str, int]:
    summary: dict[str, int] = {}
    for report in reports:
        key = report.worst if report.status == "ok" else report.status
        summary[key] = summary.get(key, 0) + 1
    return summary


def _render_summary_table(reports: Sequence[TargetReport]) -> None:
    table = Table("TARGET", "HEALTH", "TORCH CUDA", "NVCC", "FINDINGS", box=None, pad_edge=False)
    for report in reports:
        health = report.worst if report.status == "ok" else report.status
        torch = report.facts.torch if report.facts else None
        toolkits = report.facts.cuda.toolkits if report.facts else []
        codes = ", ".join(f.code for f in report.findings) or (report.error or "-")
        table.add_row(
            escape(report.target.name), f"[{SEVERITY_STYLE.get(health, 'red')}]{health}[/]",
            torch.cuda if torch and torch.cuda else "-",
            ", ".join(str(tk.version) for tk in toolkits) or "-", escape(codes),
        )
    console.print(table)
    counts = ", ".join(f"{n} {k}" for k, n in _summary(reports).items())
    console.print(f"{len(reports)} target(s): {counts}")


STATUS_STYLE = {
    "ok": "green", "changed": "yellow", "would-change": "cyan", "failed": "bold red",
    "skipped": "dim", "unreachable": "bold red", "incomplete": "magenta", "aborted": "bold red",
}


class LiveOutput:
    """Scripts' output as it arrives, `target | line` (stderr: `target ! line`), from many targets at once.

    Chunks are cut anywhere, so each (target, stream) keeps its unfinished line until its newline comes:
    lines of different targets never interleave mid-line. `flush` prints what is left. Thread-safe.
    """

    def __init__(self, out: Console | None = None, *, redact: Callable[[str], str] | None = None) -> None:
        self._console = out or console
        self._redact = redact or (lambda text: text)  # secret vars never reach the terminal
        self._lock = threading.Lock()  # one lock for buffers and printing: lines come out whole, in order
        self._partial: dict[tuple[str, Stream], bytes] = {}

    def feed(self, name: str, stream: Stream, chunk: bytes) -> None:
        with self._lock:
            *lines, rest = (self._partial.pop((name, stream), b"") + chunk).split(b"\n")
            if rest:
                self._partial[(name, stream)] = rest
            for line in lines:
                self._print(name, stream, line)

    def sink_for(self, name: str) -> OutputSink:
        """A transport-level sink (`execute(..., on_output=)`) for the target called name."""

        def sink(stream: Stream, chunk: bytes) -> None:
            self.feed(name, stream, chunk)

        return sink

    def on_output(self, target: Target, step: str, stream: Stream, chunk: bytes) -> None:
        """The `run_playbook(on_output=)` handler."""
        self.feed(target.name, stream, chunk)

    def flush(self, name: str | None = None) -> None:
        """Print the unfinished lines (of one target, or of all) as if their newline had come."""
        with self._lock:
            for key in [key for key in self._partial if name is None or key[0] == name]:
                self._print(*key, self._partial.pop(key))

    def _print(self, name: str, stream: Stream, line: bytes) -> None:
        # Text, not markup: nothing a script prints can style (or break) the terminal output.
        text = self._redact(line.rstrip(b"\r").decode(errors="replace"))  # whole lines: no cut UTF-8
        if stream == "stdout":
            self._console.print(Text.assemble((name, "bold"), " | ", text))
        else:
            self._console.print(Text.assemble((name, "bold"), " ! ", (text, "dim")))


def step_printer(*, verbose: bool, live: LiveOutput | None = None) -> Any:
    """A callback printing each step as it finishes (from worker threads: rich's print is locked).
    With live output, the step's output was already streamed: its unfinished line is flushed first."""

    def on_step(target: Target, step: Any) -> None:
        if live is not None:
            live.flush(target.name)
            verbose_replay = False
        else:
            verbose_replay = verbose
        style = STATUS_STYLE.get(step.status, "")
        console.print(f"[{style}]{step.status:<12}[/] {escape(target.name)}: {escape(step.name)}"
                      + (f" — {escape(step.reason)}" if step.reason else ""))
        if verbose_replay and step.status in ("failed", "changed") and (step.stdout or step.stderr):
            for line in (step.stdout + step.stderr).rstrip().splitlines()[-40:]:
                console.print(f"    {escape(line)}")

    return on_step


def render_apply(run: Any, *, as_json: bool) -> None:
    if as_json:
        print_json(run.to_dict())
        return
    for target_run in run.targets:
        if target_run.status in ("failed", "unreachable"):
            failed = [s for s in target_run.steps if s.status == "failed"]
            console.print(f"[bold red]{target_run.status}[/] {escape(target_run.target)}: "
                          f"{escape(target_run.reason or (failed[0].reason if failed else ''))}")
            for step in failed[:1]:
                for line in (step.stdout + step.stderr).rstrip().splitlines()[-15:]:
                    console.print(f"    {escape(line)}")
        snapshot = getattr(target_run, "snapshot", None)
        if snapshot is not None:
            if snapshot.rolled_back:
                console.print(f"[yellow]rolled back[/] {escape(target_run.target)} "
                              f"to {escape(snapshot.name)}")
            elif snapshot.rollback_error is not None:
                console.print(f"[bold red]rollback failed[/] {escape(target_run.target)}: "
                              f"{escape(snapshot.rollback_error)} (snapshot {escape(snapshot.name)} kept)")
            for warning in snapshot.warnings:
                console.print(f"[yellow]warning[/] {escape(target_run.target)}: {escape(warning)}")
    if run.aborted:
        console.print(f"[bold red]aborted[/]: {escape(run.aborted)}")
    if run.error:
        console.print(f"[bold red]error[/]: {escape(str(run.error))}")
    title = "CHECK RECAP" if run.check else "PLAY RECAP"
    console.print(f"\n[bold]{title}[/] {escape(run.playbook)} ({run.duration:.1f}s, run {run.run_id})")
    for line in run.recap_lines():
        console.print(escape(line))


def render_runs(runs: Sequence[Any], *, as_json: bool) -> None:
    if as_json:
        print_json([vars(run) for run in runs])
        return
    if not runs:
        console.print("no runs recorded")
        return
    table = Table("RUN", "STARTED", "PLAYBOOK", "MODE", "STATUS", "TARGETS", box=None, pad_edge=False)
    for run in runs:
        started = "-"
        if run.started:
            import time

            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        table.add_row(run.run_id, started, escape(run.playbook), "check" if run.check else "apply",
                      f"[{STATUS_STYLE.get(run.status, '')}]{run.status}[/]", str(len(run.targets)))
    console.print(table)


def render_run_detail(detail: Any, *, as_json: bool) -> None:
    import dataclasses

    if as_json:
        print_json({"summary": vars(detail.summary),
                    "targets": {k: dataclasses.asdict(v) for k, v in detail.targets.items()}})
        return
    summary = detail.summary
    console.print(f"[bold]run {summary.run_id}[/] {escape(summary.playbook)} "
                  f"{'check' if summary.check else 'apply'}: {summary.status}")
    for record in detail.targets.values():
        console.print(f"\n[bold]== {escape(record.name)}[/] "
                      f"[{STATUS_STYLE.get(record.status, '')}]{record.status}[/] {escape(record.reason)}")
        for step in record.steps:
            console.print(f"  [{STATUS_STYLE.get(step.status, '')}]{step.status:<12}[/] {escape(step.name)}"
                          + (f" — {escape(step.reason)}" if step.reason else ""))
            for script in step.scripts:
                rc = "running/lost" if script.rc is None else f"rc={script.rc}"
                console.print(f"      {script.phase} #{script.attempt} {rc}")
                for line in (script.stdout + script.stderr).rstrip().splitlines()[-20:]:
                    console.print(f"        {escape(line)}")
