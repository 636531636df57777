"""The command line: the only package that imports click and prints. Everything below returns data.

One module per command family; each command returns its run's ExitCode (errors.ExitCode, also in
docs/cli.md). A new command is a module here and its line below.
"""

from __future__ import annotations

import click

from fleetfix import __version__
from fleetfix.cli.apply import apply_command
from fleetfix.cli.audit import audit_group
from fleetfix.cli.exec import exec_command
from fleetfix.cli.inventory import inventory_group
from fleetfix.cli.probe import probe_command
from fleetfix.cli.runs import runs_group
from fleetfix.cli.schedule import schedule_group
from fleetfix.cli.wheels import wheels_group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


main.add_command(apply_command)
main.add_command(audit_group)
main.add_command(exec_command)
main.add_command(inventory_group)
main.add_command(probe_command)
main.add_command(runs_group)
main.add_command(schedule_group)
main.add_command(wheels_group)
