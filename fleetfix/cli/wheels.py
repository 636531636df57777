"""`fleetfix wheels ...`: look into, check and purge the controller's wheel cache (docs/extensions.md).

A manifest's key values, file names and built-on names came from targets (what `describe` printed, the
facts the key was rendered from, the wheel a build left): every line shown goes through the terminal
sanitiser, so an escape sequence in them is shown, never acted on. JSON is escaped by json.dumps.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from fleetfix.cli.common import handle_errors
from fleetfix.errors import ConfigError, ExitCode
from fleetfix.terminal import safe_line

if TYPE_CHECKING:
    from fleetfix.wheels.cache import WheelCache

_CACHE = click.option("--wheel-cache", type=click.Path(file_okay=False), default=None, metavar="DIR",
                      help="The cache (default: <state dir>/wheels).")
_STATE_DIR = click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                          help="The state dir whose wheels/ is the cache.")
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")


def _echo(line: str) -> None:
    click.echo(safe_line(line))


def _cache(wheel_cache: str | None, state_dir: str | None) -> WheelCache:
    from fleetfix.paths import default_state_dir
    from fleetfix.wheels.cache import WheelCache, default_cache_dir

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
    """List the cached wheels: entry, built on, when, build time, key, and the sha256 of the sdist the
    controller handed the build (where it held the source).

    \b
    Example:
      fleetfix wheels list
    """
    cache = _cache(wheel_cache, state_dir)
    entries = cache.entries()
    if as_json:
        click.echo(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return
    for entry in entries:
        seconds = "" if entry.build_seconds is None else f" in {entry.build_seconds:.0f} s"
        _echo(f"{entry.directory.name}  {entry.wheel}  {entry.size} bytes  built on {entry.built_on}"
              f" {entry.built_at}{seconds} ({entry.source})")
        _echo("    " + " ".join(f"{name}={value}" for name, value in sorted(entry.key.items())))
        if entry.sdist_sha256:  # the controller's own measurement of the source it handed the build
            where = entry.sdist or "location not recorded"
            _echo(f"    built from sdist sha256 {entry.sdist_sha256} ({where})")
    _echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {cache.root}")


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
    cache = _cache(wheel_cache, state_dir)
    checked = cache.verify()
    for entry, problem in checked:
        _echo(f"BAD  {entry.directory.name}: {problem}" if problem else f"ok   {entry.directory.name}")
    bad = sum(problem is not None for _, problem in checked)
    _echo(f"{len(checked)} entr{'y' if len(checked) == 1 else 'ies'} checked in {cache.root}"
          + (f", {bad} bad" if bad else ""))
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
        _echo(f"removed {entry.directory.name}")
