"""The terminal: rich consoles for stdout and stderr, plain text off a TTY or with NO_COLOR, and the styles
every text report shares."""

from __future__ import annotations

import io
import os
import sys
from typing import IO

from rich.console import Console
from rich.table import Table


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


def page() -> Console:
    """An off-screen console laid out like stdout's (width, colours): a text report is rendered into it
    and then written out as one string."""
    return Console(file=io.StringIO(), highlight=False, soft_wrap=True, width=console.width,
                   color_system="auto" if console.color_system else None,
                   force_terminal=console.is_terminal)


def page_text(out: Console) -> str:
    """What was rendered into a `page()`."""
    file = out.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


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
STATUS_STYLE = {
    "ok": "green", "changed": "yellow", "would-change": "cyan", "failed": "bold red",
    "skipped": "dim", "unreachable": "bold red", "incomplete": "magenta", "aborted": "bold red",
}
