"""Rendering for the terminal and for machines. rich honours NO_COLOR and plain output off a TTY."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

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

def _console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    # Off a terminal rich assumes 80 columns and truncates table cells ("…"): a run id piped to a file
    # could not be copied back into `runs show`. Use the terminal's width, or a wide page when piped.
    stream = file or (sys.stderr if stderr else sys.stdout)
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 200
    # rich's own NO_COLOR handling drops colours but keeps bold/dim escapes; NO_COLOR output must be
    # plain text (no control characters at all), so it gets no colour system, as off a terminal.
    plain = os.environ.get("NO_COLOR", "") != ""
    return Console(stderr=stderr, file=file, highlight=False, soft_wrap=True, width=width,
                   color_system=None if plain else "auto")


console = _console()
err_console = _console(stderr=True)

def print_table(table: Table, out: Console | None = None) -> None:
    """A table; as plain text (off a terminal, NO_COLOR) without the trailing spaces rich pads the last
    column with, so piped output diffs and greps cleanly."""
    target = out or console
    if target.color_system is not None:  # styled for a terminal: printed as rich lays it out
        target.print(table)
        return
    with target.capture() as captured:
        target.print(table)
    target.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    target.file.flush()


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "healthy": "green"}


# ---------------------------------------------------------------- what to do next

# The failures a new user meets first, each with the next thing to try. Appended to the one-line error
# here, at the reporting layer, keyed on the exception class where the exception is at hand (exec, errors
# raised to the CLI) and on the fixed phrases the transports write where only the message survived
# (probe reports, apply recaps).
NEXT_STEPS: dict[str, str] = {
    "host-key-unknown": "check the fingerprint on the node's console (`ssh-keygen -lf "
                        "/etc/ssh/ssh_host_ed25519_key.pub`); if the key is recorded in another file, "
                        "pass --known-hosts FILE",
    "host-key-changed": "confirm the new fingerprint on the node's console (`ssh-keygen -lf "
                        "/etc/ssh/ssh_host_ed25519_key.pub`) before removing the old entry",
    "auth": "check --user, and that the node's ~/.ssh/authorized_keys lists your public key; pick the key "
            "with --identity FILE (inventory: identity_file) or load it with `ssh-add`",
    "refused": "is sshd running there, on that port? check --port (inventory: port)",
    "timeout": "check the address and that this machine can reach it (firewall, VPN); on a slow link "
               "raise --connect-timeout",
    "resolve": "check the host name, or use the IP address",
    "unreachable": "check the address and port, and that this machine can reach the node (firewall, VPN)",
    "inventory-missing": "write one (see docs/inventory.md), or name a single node with --host ADDR",
}

# (kind, phrase) in the order they are tried: the changed-key phrases before anything broader.
_PHRASES: tuple[tuple[str, str], ...] = (
    ("host-key-changed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
    ("host-key-changed", "is marked @revoked"),
    ("host-key-unknown", "unknown host key for"),
    ("auth", "authentication rejected"),
    ("auth", "no SSH key to offer"),
    ("auth", "does not accept public-key login"),
    ("auth", "identity file"),
    ("refused", "connection refused"),
    ("timeout", "connect timed out after"),
    ("timeout", "SSH handshake timed out after"),
    ("resolve", "cannot resolve host"),
    ("unreachable", "No route to host"),
    ("unreachable", "Network is unreachable"),
    ("inventory-missing", "inventory file not found"),
)


def error_kind(error: BaseException | str | None) -> str | None:
    """Which of NEXT_STEPS applies to an error (an exception, or its message alone); None: none does."""
    from fleetfix.errors import (
        AuthenticationError,
        ChangedHostKeyError,
        ConnectError,
        InventoryError,
        UnknownHostKeyError,
    )

    if error is None:
        return None
    message = str(error)
    phrase_kind = next((kind for kind, phrase in _PHRASES if phrase in message), None)
    if isinstance(error, str):
        return phrase_kind
    if isinstance(error, ChangedHostKeyError):
        return "host-key-changed"
    if isinstance(error, UnknownHostKeyError):
        return "host-key-unknown"
    if isinstance(error, AuthenticationError):
        return "auth"
    if isinstance(error, ConnectError):  # refused, timed out, unresolvable, or some other way unreachable
        return phrase_kind if phrase_kind in ("refused", "timeout", "resolve") else "unreachable"
    if isinstance(error, InventoryError) and phrase_kind == "inventory-missing":
        return phrase_kind
    return None  # e.g. a connection lost mid-command: no first-run advice fits


def with_hint(message: str, error: BaseException | str | None = None) -> str:
    """message, ending with what to do next when the error is one of NEXT_STEPS' kinds. error defaults
    to message itself (only the text is known)."""
    kind = error_kind(message if error is None else error)
    return message if kind is None else f"{message} — {NEXT_STEPS[kind]}"


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
    print_table(table)
    for label, reason in skipped:
        console.print(f"skipped: {escape(label)}: {escape(reason)}")
    console.print(f"{len(targets)} target(s)" + (f", {len(skipped)} skipped" if skipped else ""))


def render_exec(
    outcomes: Sequence[Outcome[CommandResult]], *, as_json: bool, stderr_streamed: bool = False
) -> None:
    """Each target's header and stdout on stdout; its stderr too, unless it was streamed live already."""
    if as_json:
        print_json([_exec_json(o) for o in outcomes])
        return
    for outcome in outcomes:
        result = outcome.value
        if result is None:
            message = with_hint(str(outcome.error), outcome.error)
            console.print(f"[bold]== {escape(outcome.target.name)}[/] [red]{outcome.status}[/]: "
                          f"{escape(message)}")
            continue
        state = "timed out" if result.timed_out else f"exit {result.exit_code}"
        colour = "green" if result.ok else "red"
        console.print(f"[bold]== {escape(outcome.target.name)}[/] [{colour}]{state}[/]")
        if result.stdout:
            sys.stdout.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
            sys.stdout.flush()
        if result.stderr and not stderr_streamed:
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
            console.print(f"   [red]{escape(with_hint(report.error))}[/]")
        for key, value in _fact_lines(report):
            console.print(f"   {key:<12} {escape(value)}")
        for finding in report.findings:
            severity = str(finding.severity.value)
            console.print(f"   [{SEVERITY_STYLE[severity]}]{severity.upper():<7}[/] "
                          f"[bold]{finding.code}[/]: {escape(finding.summary)}")
            if finding.fix is not None:
                console.print(f"            fix: {escape(finding.fix.text())}")
        console.print()
    if len(reports) > 1:
        _render_summary_table(reports)


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
    print_table(table)
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
    labelled=False prints the lines as the command wrote them (one target: nothing to tell apart).
    """

    def __init__(
        self, out: Console | None = None, *, redact: Callable[[str], str] | None = None, labelled: bool = True
    ) -> None:
        self._labelled = labelled
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

    def sink_for(self, name: str, *, streams: Sequence[Stream] = ("stdout", "stderr")) -> OutputSink:
        """A transport-level sink (`execute(..., on_output=)`) for the target called name, printing the
        given streams only (`exec` streams stderr and keeps stdout for the end)."""

        def sink(stream: Stream, chunk: bytes) -> None:
            if stream in streams:
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
        if not self._labelled:
            self._console.print(Text(text))
        elif stream == "stdout":
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
            reason = target_run.reason or (failed[0].reason if failed else "")
            if target_run.status == "unreachable":
                reason = with_hint(reason)
            console.print(f"[bold red]{target_run.status}[/] {escape(target_run.target)}: {escape(reason)}")
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
    print_table(table)


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
