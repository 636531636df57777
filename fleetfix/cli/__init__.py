"""The command line: the only package that imports click and prints. Everything below returns data.

One module per command family; each command returns its run's ExitCode (errors.ExitCode, also in
docs/cli.md). A new command is a module here and its line in COMMANDS below.
"""

from __future__ import annotations

import importlib

import click

from fleetfix import __version__
from fleetfix.cli.collector import command_collector

# name -> "module:attribute". A command's module is imported only when that command is named (or listed, by
# `--help`): `fleetfix probe` does not load apply, audit, schedule, wheels..., whose imports would delay
# its first packet (docs/performance.md).
COMMANDS = {
    "apply": "fleetfix.cli.apply:apply_command",
    "audit": "fleetfix.cli.audit:audit_group",
    "exec": "fleetfix.cli.exec:exec_command",
    "inventory": "fleetfix.cli.inventory:inventory_group",
    "probe": "fleetfix.cli.probe:probe_command",
    "runs": "fleetfix.cli.runs:runs_group",
    "schedule": "fleetfix.cli.schedule:schedule_group",
    "wheels": "fleetfix.cli.wheels:wheels_group",
}


class LazyGroup(click.Group):
    """A group whose subcommands (COMMANDS) are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fleetfix")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and live output.")
def main(verbose: bool) -> None:
    """Find and fix broken GPU software stacks across Proxmox VE nodes, their containers and VMs.

    \b
    Examples:
      fleetfix probe --local
      fleetfix probe --host 10.1.2.6 --ct 200
      fleetfix apply playbooks/cuda-toolkit.yaml --check
    """
    click.get_current_context().with_resource(command_collector())


def command(name: str) -> click.Command:
    """The subcommand called `name`, imported if it was not yet (the tests read its options)."""
    found = main.get_command(click.Context(main), name)
    if found is None:
        raise KeyError(name)
    return found
