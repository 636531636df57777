"""The probe's progress bar on stderr (probe, audit)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

    from fleetfix.target import Target


class ProbeProgress:
    """A progress bar on stderr while targets are probed; silent off a TTY, for one target or for --json.

    rich is imported only for a bar that can show: for one target or --json its import would compete
    with the SSH handshake for the interpreter lock, for nothing."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._progress: Progress | None = None
        if not (enabled and total > 1):
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from fleetfix.reports.console import err_console

        if err_console.is_terminal:
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

    def advance(self, target: Target) -> None:
        """One more target probed."""
        if self._progress:
            self._progress.update(self._task, advance=1, description=target.name)
