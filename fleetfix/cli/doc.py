"""docs/cli.md, generated from the click commands so it cannot drift: `python -m fleetfix.cli.doc`."""

from __future__ import annotations

import click

from fleetfix.cli import main

HEADER = """# Command-line reference

Generated from the commands themselves by `python -m fleetfix.cli.doc > docs/cli.md`; a test fails when
this file is stale.

Exit codes: 0 success / healthy, 1 a command or step failed, 2 bad input (inventory, playbook, options),
3 error-severity findings, 4 a target unreachable, 130 interrupted.
"""


def _sections(command: click.Command, path: list[str], parent: click.Context | None) -> list[str]:
    # Contexts chained as in a real invocation, so inherited settings (-h, widths) show as users see them.
    settings = {"terminal_width": 100, "max_content_width": 100}
    if parent is None:
        settings = {**command.context_settings, **settings}
    ctx = click.Context(command, info_name=path[-1], parent=parent, **settings)  # type: ignore[arg-type]
    parts = [f"## `{' '.join(path)}`\n", "```text", command.get_help(ctx).rstrip(), "```\n"]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                parts += _sections(sub, [*path, name], ctx)
    return parts


def render() -> str:
    return HEADER + "\n" + "\n".join(_sections(main, ["fleetfix"], None))


if __name__ == "__main__":
    print(render(), end="")
