"""Helpers for the playbook tests: a stand-in for Fleet.map, a subprocess transport, sample facts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fleetfix.fleet import Outcome
from fleetfix.playbook.load import parse_playbook
from fleetfix.playbook.model import Playbook
from fleetfix.target import NODE, GuestRef, NodeRef, Target
from fleetfix.transport.base import CommandResult, OutputSink, Transport

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "playbooks"
R = TypeVar("R")


def problem_facts() -> dict[str, Any]:
    facts: dict[str, Any] = json.loads((FIXTURES / "facts-problem-case.json").read_text())
    return facts


def make_target(name: str, ctid: int | None = 101, **target_vars: Any) -> Target:
    guest = NODE if ctid is None else GuestRef.lxc(ctid)
    return Target(name=name, node=NodeRef("pve1", None), guest=guest, vars=target_vars)


def playbook_from(text: str, tmp_path: Path, name: str = "book.yaml") -> Playbook:
    path = tmp_path / name
    path.write_text(text)
    return parse_playbook(text, str(path))


class StandInFleet:
    """Fleet.map's shape over given transports (one per target name): fn per target on a thread pool, each
    error made an Outcome as the Fleet makes it (Outcome.failed), so the runner sees what it sees in use."""

    def __init__(self, transports: Mapping[str, Transport], workers: int = 4) -> None:
        self.transports = transports
        self.workers = workers
        self.batches: list[list[str]] = []

    def map(self, targets: Sequence[Target], fn: Callable[[Target, Transport], R]) -> list[Outcome[R]]:
        self.batches.append([target.name for target in targets])

        def one(target: Target) -> Outcome[R]:
            started = time.monotonic()
            try:
                value = fn(target, self.transports[target.name])
            except Exception as exc:
                return Outcome.failed(target, exc, time.monotonic() - started)
            return Outcome(target, "ok", value, None, time.monotonic() - started)

        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(one, targets))


class SubprocessTransport:
    """Runs commands on this machine in a given directory: enough to run rendered scripts for real."""

    def __init__(self, cwd: Path, label: str = "local") -> None:
        self.cwd, self.label = cwd, label
        self.scripts: list[str] = []

    def execute(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float | None = None,
                on_output: OutputSink | None = None) -> CommandResult:
        self.scripts.append(stdin.decode())
        started = time.monotonic()
        try:
            done = subprocess.run(list(argv), input=stdin, capture_output=True, cwd=self.cwd,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return CommandResult(-1, "", "", time.monotonic() - started, timed_out=True)
        if on_output is not None:  # not live, but every byte reaches the sink, as the protocol promises
            on_output("stdout", done.stdout)
            on_output("stderr", done.stderr)
        # decoded as the real transports decode (output need not be UTF-8)
        return CommandResult(done.returncode, done.stdout.decode(errors="replace"),
                             done.stderr.decode(errors="replace"),
                             time.monotonic() - started)


@pytest.fixture
def facts() -> dict[str, Any]:
    return problem_facts()
