"""The CLI's garbage-collector policy: few collections while a command starts, start-up's objects frozen
when its fleet opens, and the caller's collector as it was when the command ends."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from fleetfix.cli import collector, main
from fleetfix.fleet import Fleet


@pytest.fixture(autouse=True)
def collector_as_found() -> Iterator[None]:
    """Each test starts from the interpreter's defaults, with nothing frozen, and leaves them so."""
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    gc.set_threshold(700, 10, 10)
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_start_up_collects_rarely_then_the_run_as_usual_then_all_as_before() -> None:
    with collector.command_collector():
        assert gc.get_threshold() == (collector.START_UP_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() == 0
        collector.start_up_done()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # every module, class and function alive now
        assert gc.get_threshold() == (700, 10, 10)
        made_by_the_run = [[] for _ in range(100)]
        collector.start_up_done()  # once only: what the run made is not frozen
        # At most `frozen`: a thread left by an earlier test may free a frozen object meanwhile.
        assert gc.get_freeze_count() <= frozen, len(made_by_the_run)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_a_command_that_never_opens_a_fleet_gets_its_thresholds_back() -> None:
    with collector.command_collector():
        pass
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_the_thresholds_come_back_when_the_command_fails() -> None:
    with pytest.raises(RuntimeError), collector.command_collector():
        collector.start_up_done()
        raise RuntimeError("the command failed")
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_outside_a_command_nothing_is_touched() -> None:
    collector.start_up_done()  # the library, a test: no command is starting
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_a_collector_frozen_by_its_program_is_left_alone() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collector.command_collector():
        made_by_the_command = [[] for _ in range(100)]
        collector.start_up_done()
        assert gc.get_threshold() == (700, 10, 10)
    # Neither unfrozen nor frozen again (a thread left by an earlier test may free a frozen object).
    assert frozen - 100 < gc.get_freeze_count() <= frozen, len(made_by_the_command)


def test_the_programs_own_thresholds_are_the_runs() -> None:
    gc.set_threshold(50_000, 5, 5)
    with collector.command_collector():
        assert gc.get_threshold() == (collector.START_UP_THRESHOLD, 5, 5)
        collector.start_up_done()
        assert gc.get_threshold() == (50_000, 5, 5)
    assert gc.get_threshold() == (50_000, 5, 5)


def test_a_command_freezes_when_its_fleet_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI: `exec --local` opens its fleet with start-up over, and the test process gets its
    collector back."""
    seen: list[tuple[int, tuple[int, int, int]]] = []
    run = Fleet.map

    def recording_map(self: Fleet, *args: Any, **kwargs: Any) -> Any:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Fleet, "map", recording_map)
    result = CliRunner().invoke(main, ["exec", "--local", "--", "true"])
    assert result.exit_code == 0, result.output
    [(frozen, threshold)] = seen
    assert frozen > 1000 and threshold == (700, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_at_exit_nothing_is_left_to_collect() -> None:
    """The interpreter's shutdown finds everything frozen: cyclic garbage made during the command is not
    scanned for (its finalizer never runs), where without the policy shutdown would collect it."""
    program = textwrap.dedent("""
        import gc, sys
        from fleetfix.cli import collector

        class Cycle:
            def __init__(self):
                self.me = self
            def __del__(self):
                sys.stdout.write("collected\\n")

        with collector.command_collector() if sys.argv[1] == "cli" else open("/dev/null"):
            Cycle()
    """)
    outputs = {mode: subprocess.run([sys.executable, "-c", program, mode], capture_output=True, text=True,
                                    check=True).stdout for mode in ("cli", "library")}
    assert outputs == {"cli": "", "library": "collected\n"}
