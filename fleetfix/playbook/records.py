"""Run records: one append-only JSONL event log per `fleetfix apply`, written as things happen.

Layout: `<state dir>/runs/<run-id>/events.jsonl`, where the state dir is `$FLEETFIX_STATE_DIR`, else
`$XDG_STATE_HOME/fleetfix`, else `~/.local/state/fleetfix`. Every event is one JSON line, flushed and
fsync'ed before the call returns, so a crash loses at most the line being written; a run with no
`run-end` event is reported as incomplete. Events (in order of appearance):

    run-start     playbook, playbooks (the requires chain), path, check, vars (masked), targets, serial,
                  max_fail_pct
    target-start  target, facts, vars (masked)
    script-start  target, playbook, step, phase (check|apply|verify), attempt, script (rendered)
    script-end    target, playbook, step, phase, attempt, rc, stdout, stderr, duration, timed_out, error
    check-batch   target, steps ({playbook, step} per check), ran (null: not used), duration, error,
                  with_facts (sent in the facts' own command)
    step          target, playbook, step, status, reason, rc, duration, ignored
    snapshot      target, guest, vmid, ctid, snapshot (name or null), ok, error, was_running / refused
    snapshot-prune  target, guest, vmid, ctid, deleted, warnings
    rollback      target, guest, vmid, ctid, snapshot, ok, error, start, duration
    target-end    target, status, reason, duration, counts, snapshot (the outcome, or null)
    run-end       status, aborted, duration, recap

Secrets: vars named like *password*, *secret* or *token* are masked in recorded vars, and their values
(4 characters or more) are replaced by the mask wherever they appear in scripts and output.

Bounded: every string in an event (a script's output, above all) is cut to `max_field` bytes, its first and
last halves kept around a marker line that says how much was dropped (`transport.base.cap_text`): otherwise
one step's runaway output would grow the record without bound, and every later `runs list` reads it whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets as _secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from fleetfix.errors import ConfigError, StoreError
from fleetfix.paths import private_dir
from fleetfix.playbook.snapshots import SnapshotOutcome
from fleetfix.secrets import Redactor
from fleetfix.transport.base import cap_text

EVENTS_FILE = "events.jsonl"
DEFAULT_RECORD_FIELD = 256 * 1024  # bytes of one string in an event (`--record-output`)
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")


class Recorder(Protocol):
    """Where the runner sends its events. RunRecorder writes them; NullRecorder drops them."""

    @property
    def run_id(self) -> str | None: ...

    def event(self, kind: str, /, **fields: Any) -> None: ...

    def add_secrets(self, values: Iterable[str]) -> None: ...


class NullRecorder:
    run_id: str | None = None

    def event(self, kind: str, /, **fields: Any) -> None:
        return None

    def add_secrets(self, values: Iterable[str]) -> None:
        return None


def new_run_id() -> str:
    # Sortable by time; the random tail keeps two runs started in the same second apart.
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + _secrets.token_hex(3)


class RunRecorder:
    """Appends events for one run. Thread-safe: targets run concurrently and share it."""

    def __init__(self, state_dir: str | Path, *, run_id: str | None = None,
                 max_field: int = DEFAULT_RECORD_FIELD) -> None:
        self._run_id = run_id or new_run_id()
        self.max_field = max_field
        self.directory = Path(state_dir) / "runs" / self._run_id
        # Records hold command output and rendered scripts: keep them private to the user.
        private_dir(self.directory.parent)
        os.chmod(self.directory.parent, 0o700)  # runs/ is ours: tightened even if an older run left it open
        self.directory.mkdir(mode=0o700)
        os.chmod(self.directory, 0o700)
        self.path = self.directory / EVENTS_FILE
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._redact = Redactor()
        self.failure: str | None = None  # why events stopped being written

    @property
    def run_id(self) -> str:
        return self._run_id

    def add_secrets(self, values: Iterable[str]) -> None:
        self._redact.add(values)

    def event(self, kind: str, /, **fields: Any) -> None:
        """Append one event. A write that fails (a full disk) is one StoreError, for the target whose
        event it was; the record is then closed: later events are dropped, and `runs show` reads it as
        incomplete, with every event before the failure."""
        record = {"time": time.time(), "kind": kind, **fields}
        with self._lock:
            line = json.dumps(_capped(self._redact(record), self.max_field), default=str, ensure_ascii=False)
            if self._file.closed:
                return
            try:
                self._file.write(line + "\n")
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as error:
                self.failure = f"cannot write the run record {self.path}: {error.strerror or error}"
                with contextlib.suppress(OSError):
                    self._file.close()
                raise StoreError(self.failure) from None

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._file.close()

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _capped(value: Any, cap: int) -> Any:
    """value with every string in it cut to cap bytes (redacted first: a cut never splits a secret)."""
    if isinstance(value, str):
        return cap_text(value, cap)
    if isinstance(value, dict):
        return {key: _capped(item, cap) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_capped(item, cap) for item in value]
    return value



# --- reading ---------------------------------------------------------------------------------------

@dataclass
class ScriptRecord:
    phase: str
    attempt: int
    script: str
    rc: int | None = None  # None: it never finished (crash, or the link dropped)
    stdout: str = ""
    stderr: str = ""
    duration: float | None = None
    timed_out: bool = False
    error: str | None = None
    finished: bool = False


@dataclass
class StepRecord:
    playbook: str
    name: str
    status: str = "incomplete"
    reason: str = ""
    rc: int | None = None
    duration: float | None = None
    ignored: bool = False
    scripts: list[ScriptRecord] = field(default_factory=list)


@dataclass
class TargetRecord:
    name: str
    status: str = "incomplete"
    reason: str = ""
    duration: float | None = None
    facts: dict[str, Any] | None = None
    vars: dict[str, Any] | None = None
    steps: list[StepRecord] = field(default_factory=list)
    snapshot: SnapshotOutcome | None = None  # taken, refused, pruned, rolled back (with --snapshot)


@dataclass
class RunSummary:
    run_id: str
    started: float | None
    finished: float | None
    playbook: str
    check: bool
    targets: list[str]
    status: str  # the run-end status, or "incomplete" when the run never ended
    target_statuses: dict[str, str]


@dataclass
class RunDetail:
    summary: RunSummary
    targets: dict[str, TargetRecord]
    events: list[dict[str, Any]]
    report_kind: ClassVar[str] = "run"

    def to_json(self) -> dict[str, Any]:
        return {"summary": vars(self.summary),
                "targets": {name: asdict(record) for name, record in self.targets.items()}}


@dataclass
class RunList:
    """The recorded runs, as `fleetfix runs list` shows them."""

    report_kind: ClassVar[str] = "runs"
    runs: list[RunSummary]

    def to_json(self) -> list[dict[str, Any]]:
        return [vars(run) for run in self.runs]


def _runs_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "runs"


def _read_events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if isinstance(event, dict):
                events.append(event)
    return events


def _summary(run_id: str, events: list[dict[str, Any]]) -> RunSummary:
    start = next((e for e in events if e.get("kind") == "run-start"), {})
    end = next((e for e in events if e.get("kind") == "run-end"), None)
    statuses = {str(e.get("target")): str(e.get("status")) for e in events if e.get("kind") == "target-end"}
    return RunSummary(
        run_id=run_id, started=start.get("time"), finished=end.get("time") if end else None,
        playbook=str(start.get("playbook", "?")), check=bool(start.get("check", False)),
        targets=[str(name) for name in start.get("targets", [])],
        status=str(end.get("status")) if end else "incomplete", target_statuses=statuses,
    )


def list_runs(state_dir: str | Path) -> list[RunSummary]:
    """Every recorded run, oldest first."""
    runs_dir = _runs_dir(state_dir)
    if not runs_dir.is_dir():
        return []
    summaries = []
    for directory in sorted(runs_dir.iterdir()):
        events_path = directory / EVENTS_FILE
        if events_path.is_file():
            summaries.append(_summary(directory.name, _read_events(events_path)))
    return summaries


def load_run(state_dir: str | Path, run_id: str) -> RunDetail:
    """One run, with every target's steps and every script's output. Raises ConfigError if unknown."""
    if not _RUN_ID.match(run_id):
        raise ConfigError("not a run id (see `fleetfix runs list`)", field=run_id)
    events_path = _runs_dir(state_dir) / run_id / EVENTS_FILE
    if not events_path.is_file():
        raise ConfigError("no such run (see `fleetfix runs list`)", field=run_id)
    events = _read_events(events_path)
    targets: dict[str, TargetRecord] = {}

    def target(name: Any) -> TargetRecord:
        return targets.setdefault(str(name), TargetRecord(str(name)))

    def step(event: dict[str, Any]) -> StepRecord:
        record = target(event.get("target"))
        key = (str(event.get("playbook", "")), str(event.get("step", "")))
        if not record.steps or (record.steps[-1].playbook, record.steps[-1].name) != key:
            record.steps.append(StepRecord(*key))
        return record.steps[-1]

    summary = _summary(run_id, events)
    for name in summary.targets:
        target(name)
    for event in events:
        kind = event.get("kind")
        if kind == "target-start":
            record = target(event.get("target"))
            record.facts, record.vars = event.get("facts"), event.get("vars")
        elif kind == "script-start":
            step(event).scripts.append(ScriptRecord(
                phase=str(event.get("phase")), attempt=int(event.get("attempt", 1)),
                script=str(event.get("script", ""))))
        elif kind == "script-end":
            current = step(event)
            if current.scripts:
                script = current.scripts[-1]
                script.rc, script.duration = event.get("rc"), event.get("duration")
                script.stdout, script.stderr = str(event.get("stdout", "")), str(event.get("stderr", ""))
                script.timed_out, script.error = bool(event.get("timed_out")), event.get("error")
                script.finished = True
        elif kind == "step":
            current = step(event)
            current.status, current.reason = str(event.get("status")), str(event.get("reason", ""))
            current.rc, current.duration = event.get("rc"), event.get("duration")
            current.ignored = bool(event.get("ignored"))
        elif kind in ("snapshot", "snapshot-prune", "rollback"):
            record = target(event.get("target"))
            record.snapshot = _snapshot_event(record.snapshot or SnapshotOutcome(), kind, event)
        elif kind == "target-end":
            record = target(event.get("target"))
            record.status, record.reason = str(event.get("status")), str(event.get("reason", ""))
            record.duration = event.get("duration")
            if isinstance(event.get("snapshot"), dict):  # the whole outcome, warnings included
                record.snapshot = _snapshot_outcome(event["snapshot"])
    return RunDetail(summary=summary, targets=targets, events=events)


def _snapshot_event(outcome: SnapshotOutcome, kind: str, event: dict[str, Any]) -> SnapshotOutcome:
    """The snapshot events, one by one: a run killed before a target ended still shows the snapshot it
    took (the way back is what matters most then)."""
    if kind == "snapshot" and event.get("ok"):
        outcome.name = str(event.get("snapshot"))
    elif kind == "snapshot":
        outcome.unavailable, outcome.refused = str(event.get("error")), bool(event.get("refused"))
    elif kind == "snapshot-prune":
        outcome.pruned = [str(name) for name in event.get("deleted") or ()]
        outcome.warnings += [str(warning) for warning in event.get("warnings") or ()]
    elif event.get("ok"):
        outcome.rolled_back = True
    else:
        outcome.rollback_error = str(event.get("error"))
    return outcome


def _snapshot_outcome(data: dict[str, Any]) -> SnapshotOutcome:
    return SnapshotOutcome(
        name=data.get("name"), unavailable=data.get("unavailable"), refused=bool(data.get("refused")),
        pruned=[str(name) for name in data.get("pruned") or ()], rolled_back=bool(data.get("rolled_back")),
        rollback_error=data.get("rollback_error"), warnings=[str(w) for w in data.get("warnings") or ()],
    )
