"""`fleetfix inventory ...`: what the inventory resolves to."""

from __future__ import annotations

import click

from fleetfix.cli.common import (
    FleetOptions,
    ReportChoice,
    handle_errors,
    report_options,
    resolve,
    targeting_options,
)
from fleetfix.inventory.request import TargetRequest


@click.group("inventory")
def inventory_group() -> None:
    """Inspect the inventory."""


@inventory_group.command("list")
@targeting_options
@report_options("targets")
@handle_errors
def inventory_list(report: ReportChoice, targets: TargetRequest, fleet_options: FleetOptions) -> None:
    """List the resolved targets, with their node, vars, tags and groups.

    \b
    Example:
      fleetfix inventory list -i inventory.yaml --limit tag:training
    """
    report.emit(resolve(targets))
