"""Probe a fleet: one probe script per target, one node-facts script per node, then the diagnosis.

Library code: returns `TargetReport`s; the CLI renders them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from fleetfix.errors import ExitCode, FleetfixError
from fleetfix.fleet import Fleet, Outcome, Pending, RunOnThread
from fleetfix.guests import NODE_BATCHES
from fleetfix.guests.pctbatch import PctBatch, Submitted
from fleetfix.importahead import import_ahead
from fleetfix.probe.script import build_node_script, build_probe_script
from fleetfix.target import Target
from fleetfix.transport.base import SHELL_STDIN, CommandResult, Transport, command_line, run_script

if TYPE_CHECKING:
    from fleetfix.probe.facts import Facts, NodeFacts
    from fleetfix.probe.rules import Finding

R = TypeVar("R")

# What reads the probe's output: imported while the first scripts run (import_ahead), not before they are
# sent. Together ~0.12 s of CPU, most of it pydantic building the facts models (one target: ~0.04 s less
# wall time, issue 21).
MODEL_MODULES = ("fleetfix.probe.facts", "fleetfix.probe.rules")

PROBE_TIMEOUT = 120.0
NODE_FACTS_TIMEOUT = 30.0
# --deep imports torch and each extension in child processes, each with its own limit.
DEEP_PROBE_TIMEOUT = 900.0


@dataclass
class TargetReport:
    target: Target
    status: str  # "ok" | "unreachable" | "failed"
    facts: Facts | None = None
    node: NodeFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    error: FleetfixError | None = None
    duration: float = 0.0

    @property
    def worst(self) -> str:
        """The worst severity among findings, or "healthy"."""
        for severity in ("error", "warning", "info"):  # Severity's values (a StrEnum), worst first
            if any(finding.severity == severity for finding in self.findings):
                return severity
        return "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.name,
            "node": self.target.node.name,
            **self.target.guest.to_json(),
            "status": self.status,
            "health": self.worst if self.status == "ok" else self.status,
            "error": None if self.error is None else str(self.error),
            "duration": round(self.duration, 3),
            "findings": [finding.model_dump(mode="json") for finding in self.findings],
            "facts": self.facts.model_dump(mode="json") if self.facts else None,
            "node_facts": self.node.model_dump(mode="json") if self.node else None,
        }


def python_interpreters(target: Target) -> list[str]:
    """The python envs to inspect, from the target's vars: `pythons` (list) or `python` (one)."""
    pythons = target.vars.get("pythons")
    if isinstance(pythons, list) and pythons:
        return [str(p) for p in pythons]
    return [str(target.vars.get("python", "python3"))]


def discovers_pythons(target: Target) -> bool:
    """Whether the probe also looks for torch envs nobody named and inspects them: yes, unless the target
    pins its list with `pythons` (docs/inventory.md). `python` names the main interpreter and keeps it on."""
    pythons = target.vars.get("pythons")
    return not (isinstance(pythons, list) and pythons)


ProbeKey = tuple[str, tuple[str, ...], bool]   # node, interpreters, discovery: one script per key


class _NodeFactsCache:
    """Node facts are gathered once per node, by whichever of its containers comes first (VMs have their
    own kernel and driver: they never ask)."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._facts: dict[str, NodeFacts | None] = {}
        self._batched: dict[str, tuple[PctBatch, Submitted]] = {}  # the node script runs in this batch

    def _node_lock(self, target: Target) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(target.node.name, threading.Lock())

    def start(self, target: Target, batch: PctBatch | None = None) -> None:
        """Start gathering the node's facts if no container has, alongside the first container's probe
        instead of before it (for one container that was a round trip and the node script's run, ~0.11 s of
        a 0.9 s probe at 20 ms RTT, issue 21): in the container's batch if it has one (no channel or thread
        of its own, ~1.5 ms of controller CPU per node), else on a thread and channel of its own. The
        others go on to their own probes; `get` waits for it."""
        name = target.node.name
        if name in self._facts or name in self._batched:  # the node's later containers: nothing to start
            return
        node_lock = self._node_lock(target)
        if not node_lock.acquire(blocking=False):
            return
        submitted = batch.submit_node() if batch is not None else None
        if batch is not None and submitted is not None:  # the batch's thread answers; `get` waits for it
            with self._lock:
                self._batched[name] = (batch, submitted)
            node_lock.release()
            return
        threading.Thread(target=self._fill_then_release, args=(target, node_lock), daemon=True,
                         name=f"node-facts-{name}").start()

    def _fill_then_release(self, target: Target, node_lock: threading.Lock) -> None:
        try:
            # A failure is not kept: `get` tries again on the container's own thread and raises it there.
            with contextlib.suppress(Exception):
                self._fill(target)
        finally:
            node_lock.release()

    def get(self, target: Target) -> NodeFacts | None:
        """The node's facts, gathered now or waited for if another container is gathering them."""
        with self._node_lock(target):
            self._fill(target)
            return self._facts[target.node.name]

    def _fill(self, target: Target) -> None:  # with the node's lock held
        if target.node.name not in self._facts:
            self._facts[target.node.name] = self._gather(target)

    def _gather(self, target: Target) -> NodeFacts | None:
        with self._lock:
            batched = self._batched.get(target.node.name)
        result = batched[0].node_result(batched[1], NODE_FACTS_TIMEOUT) if batched is not None else None
        if result is None:  # no batch, or it could not run the script: a channel of its own
            result = run_script(self._fleet.node_transport(target), build_node_script(),
                                timeout=NODE_FACTS_TIMEOUT)
        if not result.ok:
            return None
        from fleetfix.probe.facts import parse_node_facts

        return parse_node_facts(result.stdout)


class _NodeBatches:
    """Containers of one node that get the same probe script share one channel (guests/pctbatch.py): the
    first of them to start opens it; the node's thread finishes each as its result comes in (Fleet's
    staged targets: no thread waits for one). Nodes with one such container, or reached through become,
    or whose connection cannot feed stdin over time (a test's fake), probe each container on its own
    channel, as does anything a batch could not answer."""

    # One argument of the node's command line; Linux limits one argument to 128 KiB (MAX_ARG_STRLEN).
    MAX_COMMAND_LINE = 100_000

    def __init__(self, fleet: Fleet, targets: Sequence[Target], *, deep: bool) -> None:
        self._fleet = fleet
        self._deep = deep
        self._timeout = DEEP_PROBE_TIMEOUT if deep else PROBE_TIMEOUT
        self._expected: dict[ProbeKey, int] = {}
        for target in targets:
            if target.guest.kind in NODE_BATCHES:
                key = self._key(target)
                self._expected[key] = self._expected.get(key, 0) + 1
        self._batches: dict[ProbeKey, PctBatch | None] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(target: Target) -> ProbeKey:
        return target.node.name, tuple(python_interpreters(target)), discovers_pythons(target)

    def submit(self, target: Target, notify: Callable[[], None]) -> tuple[PctBatch, Submitted] | None:
        """Feed the target to its node's batch (PctBatch.submit), or None: probe it on its own channel."""
        key = self._key(target)
        if self._expected.get(key, 0) < 2 or target.guest.id is None:
            return None
        with self._lock:
            if key not in self._batches:
                self._batches[key] = self._open(target, key)
            batch = self._batches[key]
        if batch is None:
            return None
        submitted = batch.submit(target.guest.id, notify)
        return None if submitted is None else (batch, submitted)

    def _open(self, target: Target, key: ProbeKey) -> PctBatch | None:
        node = self._fleet.feedable_node_transport(target)
        if node is None:
            return None
        script = with_buffered_stdout(build_probe_script(list(key[1]), deep=self._deep, discover=key[2]))
        if len(command_line([script])) > self.MAX_COMMAND_LINE:  # as quoted for the node's shell
            return None
        return NODE_BATCHES[target.guest.kind](
            node, target.node.name, SHELL_STDIN, stdin=script, timeout=self._timeout,
            max_output=self._fleet.max_output, expected=self._expected[key], node_script=build_node_script())

    def close(self) -> None:
        """No more targets: each node finishes what it runs and ends its channel."""
        with self._lock:
            batches = [batch for batch in self._batches.values() if batch is not None]
        for batch in batches:
            batch.close()


@dataclass
class ProbeRun:
    """Every target's report, in input order; knows the exit code it calls for."""

    report_kind: ClassVar[str] = "probe"
    reports: list[TargetReport]

    @property
    def exit_code(self) -> ExitCode:
        if any(report.status != "ok" for report in self.reports):
            return ExitCode.UNREACHABLE
        if any(report.worst == "error" for report in self.reports):
            return ExitCode.FINDINGS
        return ExitCode.OK

    def summary(self) -> dict[str, int]:
        """How many targets at each health ("error", "healthy", "unreachable", ...), in first-seen order."""
        counts: dict[str, int] = {}
        for report in self.reports:
            key = report.worst if report.status == "ok" else report.status
            counts[key] = counts.get(key, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"targets": [report.to_json() for report in self.reports], "summary": self.summary()}


def probe_targets(
    fleet: Fleet,
    targets: Sequence[Target],
    *,
    deep: bool = False,
    on_probed: Callable[[Target], None] | None = None,
    also_import: Sequence[str] = (),
) -> list[TargetReport]:
    """Probe every target; their reports, in input order. on_probed(target) as each target's probe ends
    (from worker threads: a progress bar). also_import: modules the caller needs afterwards (its report's
    renderer), imported while the first scripts run, with the probe's own models (fleetfix.importahead).

    The outputs are read and diagnosed after the last probe has ended, one after the other: done on the node
    threads as each came in, between the other threads' packets, the same work cost 200 targets ~70-85 ms
    of CPU, in one pass afterwards ~25-45 ms (issue 21, docs/performance.md). What it costs: a target's
    findings come with the others', not as it finishes. A caller that takes each report as it comes (the
    audit commits them one by one) uses probe_each."""
    def probed(item: _Probed | TargetReport) -> _Probed | TargetReport:
        if on_probed:
            on_probed(item.target)
        return item

    items = _probe(fleet, targets, deep=deep, finish=probed, also_import=also_import)
    for index, item in enumerate(items):  # in place: each output is dropped once it is read
        if isinstance(item, _Probed):
            items[index] = item.report()
    return cast("list[TargetReport]", items)


def probe_each(fleet: Fleet, targets: Sequence[Target], *, deep: bool = False,
               on_done: Callable[[TargetReport], None]) -> None:
    """Probe every target and hand each report to on_done (from worker threads) as it finishes, keeping
    none: for a caller that takes each one in there (the audit commits it). Held to the end, 10,000
    targets' facts were ~200 MB of the audit's peak memory, and even without them their reports (findings,
    node facts) ~8 KiB each (issue 21)."""
    def report(item: _Probed | TargetReport) -> None:
        on_done(item.report() if isinstance(item, _Probed) else item)

    _probe(fleet, targets, deep=deep, finish=report)


@dataclass
class _Probed:
    """A target whose probe has ended: its output, not read yet (probe_targets reads them all at the end)."""

    target: Target
    stdout: str
    node: NodeFacts | None
    duration: float

    def report(self) -> TargetReport:
        """The output read and diagnosed; a failed report for output that is not the probe's (or a bug in a
        rule: for this target only, as anything raised for a target while the fleet runs it)."""
        from fleetfix.probe.facts import parse_facts  # loaded by now (import_ahead)
        from fleetfix.probe.rules import diagnose

        try:
            facts = parse_facts(self.stdout)
            required = self.target.vars.get("required_extensions") or ()
            findings = diagnose(facts, self.node, required_extensions=[str(name) for name in required],
                                guest=self.target.guest)
        except Exception as error:
            failed = Outcome.failed(self.target, error, self.duration)
            return TargetReport(self.target, failed.status, error=failed.error, duration=self.duration)
        return TargetReport(self.target, "ok", facts, self.node, findings, duration=self.duration)


def _probe(
    fleet: Fleet, targets: Sequence[Target], *, deep: bool,
    finish: Callable[[_Probed | TargetReport], R], also_import: Sequence[str] = (),
) -> list[R]:
    """What finish makes of each target, in input order: of its output once the probe ended (with the
    node's facts), or of its failed report."""
    node_cache = _NodeFactsCache(fleet)
    batches = _NodeBatches(fleet, targets, deep=deep)
    importing = threading.Lock()

    def begin(target: Target, batch: PctBatch | None = None) -> bool:
        """What every target starts with; whether its node's facts apply to it."""
        if importing.acquire(blocking=False):  # the first target is connected: its script goes out now
            import_ahead(*MODEL_MODULES, *also_import)
        # The node's kernel module is the driver only for guests on the node's kernel (not a VM's).
        on_node_kernel = fleet.guest(target).shares_node_kernel
        if on_node_kernel:
            node_cache.start(target, batch)
        return on_node_kernel

    def ended(target: Target, stdout: str, on_node_kernel: bool, started: float) -> R:
        node = node_cache.get(target) if on_node_kernel else None
        return finish(_Probed(target, stdout, node, time.monotonic() - started))

    def probe_one(target: Target, transport: Transport) -> R:
        """A target on a channel of its own."""
        started = time.monotonic()
        on_node_kernel = begin(target)
        return ended(target, _probe_output(target, transport, deep=deep), on_node_kernel, started)

    def start(target: Target, _transport: Transport, notify: Callable[[], None]) -> Pending[R] | None:
        """A target in its node's batch, without a thread waiting for it (None: not batched)."""
        started = time.monotonic()
        submitted = batches.submit(target, notify)
        if submitted is None:
            return None  # probe_one begins it
        batch, fed = submitted
        on_node_kernel = begin(target, batch)

        def finished() -> R:
            result = batch.result(fed)
            if result is None:  # the batch could not run it: on a channel of its own
                raise RunOnThread
            return ended(target, _output_of(result, deep=deep), on_node_kernel, started)

        return Pending(fed.deadline, finished)

    def from_outcome(outcome: Outcome[R]) -> R:
        if outcome.ok:
            return cast(R, outcome.value)
        return finish(TargetReport(outcome.target, outcome.status, error=outcome.error,
                                   duration=outcome.duration))

    try:
        outcomes = fleet.map(targets, probe_one, start=start)
    finally:
        batches.close()
    return [from_outcome(outcome) for outcome in outcomes]


def gather_facts(target: Target, transport: Transport, *, deep: bool = False) -> Facts:
    """The probe on one target, for playbooks: its facts only."""
    from fleetfix.probe.facts import parse_facts  # after the script ran: see MODEL_MODULES

    return parse_facts(_probe_output(target, transport, deep=deep))


def _probe_output(target: Target, transport: Transport, *, deep: bool) -> str:
    script = build_probe_script(python_interpreters(target), deep=deep, discover=discovers_pythons(target))
    timeout = DEEP_PROBE_TIMEOUT if deep else PROBE_TIMEOUT
    return _output_of(run_script(transport, with_buffered_stdout(script), timeout=timeout), deep=deep)


def _output_of(result: CommandResult, *, deep: bool) -> str:
    """The probe's output in a probe script's result (read later: parse_facts)."""
    if result.timed_out:
        raise FleetfixError(f"probe timed out after {DEEP_PROBE_TIMEOUT if deep else PROBE_TIMEOUT:.0f}s")
    return result.stdout


def with_buffered_stdout(script: str) -> str:
    """The same sh script, its stdout written in one piece when it ends instead of line by line.

    Why: sshd sends every write as its own SSH packet, and paramiko spends a fraction of a millisecond of
    controller CPU per packet in its transport thread; the probe writes its JSON in dozens of pieces, which
    cost ~10 ms of controller CPU per container against ~3 ms in one piece (benchmarks/, docs/performance.md).
    The output is held in a shell variable on the target (the probe writes no files) and printed exactly:
    the trailing "x" keeps command substitution from eating trailing newlines. The exit status is the
    script's; stderr is not buffered. The script runs in a subshell, so its own `exit` ends only that.
    """
    return (
        "__fleetfix_out=$(\n(\n:\n"  # ":" so an empty (or comments-only) script is still valid sh
        f"{script.rstrip(chr(10))}\n"
        ")\n__fleetfix_rc=$?; printf x; exit $__fleetfix_rc\n)\n"
        "__fleetfix_rc=$?\n"
        "printf '%s' \"${__fleetfix_out%x}\"\n"
        "exit $__fleetfix_rc\n"
    )
