"""`fleetfix wheels ...`: look into, check and purge the controller's wheel cache (docs/extensions.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from fleetfix.cli.common import handle_errors
from fleetfix.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from fleetfix.wheelcache import WheelCache

_CACHE = click.option("--wheel-cache", type=click.Path(file_okay=False), default=None, metavar="DIR",
                      help="The cache (default: <state dir>/wheels).")
_STATE_DIR = click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                          help="The state dir whose wheels/ is the cache.")
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")


def _cache(wheel_cache: str | None, state_dir: str | None) -> WheelCache:
    from fleetfix.paths import default_state_dir
    from fleetfix.wheelcache import WheelCache, default_cache_dir

    return WheelCache(wheel_cache or default_cache_dir(state_dir or default_state_dir()))


@click.group("wheels")
def wheels_group() -> None:
    """The wheel cache of `wheels` steps: one pip wheelhouse per binary-compatibility key."""


@wheels_group.command("list")
@_CACHE
@_STATE_DIR
@_JSON
@handle_errors
def wheels_list(wheel_cache: str | None, state_dir: str | None, as_json: bool) -> None:
    """List the cached wheels: entry, built on, when, build time, key.

    \b
    Example:
      fleetfix wheels list
    """
    entries = _cache(wheel_cache, state_dir).entries()
    if as_json:
        click.echo(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return
    for entry in entries:
        seconds = "" if entry.build_seconds is None else f" in {entry.build_seconds:.0f} s"
        click.echo(f"{entry.directory.name}  {entry.wheel}  {entry.size} bytes  built on {entry.built_on}"
                   f" {entry.built_at}{seconds} ({entry.source})")
        click.echo("    " + " ".join(f"{name}={value}" for name, value in sorted(entry.key.items())))
    click.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in "
               f"{_cache(wheel_cache, state_dir).root}")


@wheels_group.command("verify")
@_CACHE
@_STATE_DIR
@handle_errors
def wheels_verify(wheel_cache: str | None, state_dir: str | None) -> ExitCode:
    """Re-hash every cached wheel against its manifest; exit 1 if any differs (nothing is changed: the
    next apply refuses and rebuilds such an entry by itself).

    \b
    Example:
      fleetfix wheels verify
    """
    bad = 0
    for entry, problem in _cache(wheel_cache, state_dir).verify():
        bad += problem is not None
        status = f"BAD  {entry.directory.name}: {problem}" if problem else f"ok   {entry.directory.name}"
        click.echo(status)
    return ExitCode.FAILED if bad else ExitCode.OK


@wheels_group.command("purge")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@_CACHE
@_STATE_DIR
@handle_errors
def wheels_purge(names: tuple[str, ...], everything: bool, wheel_cache: str | None,
                 state_dir: str | None) -> None:
    """Remove the entries of the named distributions (any spelling: causal_conv1d, causal-conv1d), or
    --all. The next apply builds them again.

    \b
    Examples:
      fleetfix wheels purge causal-conv1d
      fleetfix wheels purge --all
    """
    if not names and not everything:
        raise ConfigError("name the distributions to purge, or pass --all")
    for entry in _cache(wheel_cache, state_dir).purge(names=names, everything=everything):
        click.echo(f"removed {entry.directory.name}")
