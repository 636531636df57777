"""`wheels` steps: build a Python wheel once per binary-compatibility key, install it everywhere else.

Per item of the step, on one target:

    verify                          exit 0 → already installed, nothing to do
    describe                        last stdout line "NAME VERSION": what the item resolves to here
    key = the step's rendered key fields + name + version     (fleetfix.wheelcache: any empty field →
                                                               built as before, never cached)
    with the cache's lock on key:   the first target of a key builds; the others wait here, then hit
        hit (sha256 re-checked)  →  push the wheel, install, verify              ("installed from cache")
        miss, and the item names upstream's release wheel whose label matches the key exactly
                                 →  the controller downloads it, checks its dist-info, pushes it,
                                    install, verify, and only then stores it with its URL and sha256
                                    ("installed from upstream"); not there, unreachable, or failing the
                                    install or import check → on to the build, nothing cached
        miss or --rebuild        →  build into $FLEETFIX_WHEEL_DIR, install, verify, pull the wheel back
                                    into the cache with its manifest            ("built")

Ordering across concurrent targets is the per-key lock and nothing else: targets run as the fleet runs them
(per node and --forks), each holds at most one key's lock at a time (items are done one by one, the lock is
released after each), so there is no lock cycle; a builder that fails releases the key and the next waiter
builds. A wheel is only ever installed on a target whose full key equals the entry's (the lookup compares
the whole key), and only after its sha256 matched its manifest on the controller and again in the target
(Guest.push).

Scripts run through the step runner (`execute`), so each is recorded like any other script of the step;
every decision is recorded as a `wheel` event (key, digest, action, entry, refused entries).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from fleetfix.errors import FleetfixError
from fleetfix.guests.base import Guest
from fleetfix.guests.transfer import DEFAULT_MAX_BYTES
from fleetfix.httpfetch import Fetcher, FetchError
from fleetfix.playbook.render import RenderedItem
from fleetfix.releasewheels import candidate
from fleetfix.transport.base import Transport
from fleetfix.wheelcache import (
    WheelCache,
    canonical_name,
    missing_fields,
    wheel_name_version,
    wheel_problem,
)

WORK_ROOT = "/var/tmp"  # per item: <WORK_ROOT>/fleetfix-wheels-<random>, 0700, removed afterwards
SOURCE_MARKER = "FLEETFIX_WHEEL_SOURCE="  # a build's stdout line naming where a downloaded wheel came from
_LIST_WHEELS = 'for f in "$1"/*.whl; do [ -f "$f" ] && printf "%s\\n" "$f"; done; true'


@dataclass(frozen=True)
class WheelOptions:
    """The controller's side of wheels steps: where the cache is, and whether to ignore it."""

    cache: WheelCache | None = None  # None: build on every target, as without a cache
    rebuild: bool = False  # build even when the cache or a wheelhouse has the key; replace the entry
    # Downloads upstream's release wheels for items that name one (None: never; they are built)
    upstream: Fetcher | None = None


class ScriptResult(Protocol):
    @property
    def rc(self) -> int | None: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def timed_out(self) -> bool: ...


WheelPhase = Literal["describe", "build", "install", "verify"]
Execute = Callable[[WheelPhase, str], ScriptResult]  # (phase, script) → the recorded run


@dataclass
class WheelsOutcome:
    status: str  # "ok" | "changed" | "failed"
    lines: list[str] = field(default_factory=list)  # one per item

    @property
    def reason(self) -> str:
        return "; ".join(self.lines)


class _ItemFailed(Exception):
    pass


def _ok(run: ScriptResult) -> bool:
    return run.rc == 0 and not run.timed_out


def _why(run: ScriptResult) -> str:
    if run.timed_out:
        return "timed out"
    lines = [line.strip() for line in (run.stderr.strip() or run.stdout.strip()).splitlines() if line.strip()]
    return f"exit {run.rc}" + (f": {lines[-1]}" if lines else "")


def label(item: Any) -> str:
    """What the recap calls an item: the text before any control character (the playbook's separator)."""
    return re.split(r"[\x00-\x1f]", str(item), maxsplit=1)[0].strip() or str(item)


def with_env(script: str, **values: str) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items()) + script


def run_wheels(
    items: list[RenderedItem], *, execute: Execute, transport: Transport, guest: Callable[[], Guest],
    options: WheelOptions, target: str, event: Callable[..., None],
) -> WheelsOutcome:
    """Every item in order; the first failing item fails the step (later items are not tried)."""
    outcome = WheelsOutcome("ok")
    for item in items:
        name = label(item.item)
        if _ok(execute("verify", item.verify)):
            outcome.lines.append(f"{name}: already installed")
            continue
        try:
            outcome.lines.append(_one(item, name, execute, transport, guest, options, target, event))
        except _ItemFailed as failure:
            outcome.lines.append(f"{name}: {failure}")
            outcome.status = "failed"
            return outcome
        outcome.status = "changed"
    return outcome


@contextlib.contextmanager
def _work_dir(transport: Transport) -> Iterator[str]:
    """A private scratch directory in the target, removed afterwards whatever happened."""
    work = f"{WORK_ROOT}/fleetfix-wheels-{secrets.token_hex(6)}"
    made = transport.execute(("mkdir", "-m", "700", "--", work), timeout=60)
    if not made.ok:
        raise _ItemFailed(f"cannot create {work}: {(made.stderr or made.stdout).strip()}")
    try:
        yield work
    finally:
        with contextlib.suppress(FleetfixError):
            transport.execute(("rm", "-rf", "--", work), timeout=300)


def _one(item: RenderedItem, name: str, execute: Execute, transport: Transport, guest: Callable[[], Guest],
         options: WheelOptions, target: str, event: Callable[..., None]) -> str:
    described = execute("describe", item.describe)
    words = (described.stdout.strip().splitlines() or [""])[-1].split()
    if not _ok(described) or len(words) != 2:
        raise _ItemFailed("describe failed: " + (_why(described) if not _ok(described)
                                                 else f"expected 'NAME VERSION', got {' '.join(words)!r}"))
    key = {**item.key, "name": canonical_name(words[0]), "version": words[1]}
    name = f"{key['name']} {key['version']}"
    missing = missing_fields(key)
    cache = options.cache if not missing else None
    lock = cache.lock(key) if cache is not None else contextlib.nullcontext()
    record: dict[str, Any] = {"item": name, "key": key, "missing": missing}
    with _work_dir(transport) as work, lock:
        found = cache.lookup(key) if cache is not None and not options.rebuild else None
        refused = found.refused if found is not None else []
        record["refused"] = refused
        note = f" (refused: {'; '.join(refused)})" if refused else ""
        if found is not None and found.entry is not None:
            entry = found.entry
            remote = f"{work}/{entry.wheel}"
            pushed = guest().push(entry.path, remote, mode=0o600, max_bytes=max(entry.size, 1))
            if pushed.sha256 != entry.sha256:  # changed on the controller since the lookup re-hashed it
                raise _ItemFailed(f"{entry.directory.name} changed while it was pushed; not installed")
            _install_and_verify(item, execute, work, remote, what="the cached wheel")
            event("wheel", **record, action="installed-from-cache", entry=entry.directory.name,
                  sha256=pushed.sha256, size=pushed.size, built_on=entry.built_on)
            return (f"{name}: installed from the wheel cache ({entry.directory.name}, built on "
                    f"{entry.built_on}, sha256 {entry.sha256[:12]}){note}")
        if cache is not None and item.upstream and options.upstream is not None and not options.rebuild:
            got = _from_upstream(item, key, execute, guest, cache, options.upstream, work, event, record)
            if isinstance(got, _Installed):
                return f"{name}: {got.line}{note}"
            record["upstream"] = got
            note += f" (upstream: {got})"
        started = time.monotonic()
        built = execute("build", with_env(item.build, FLEETFIX_WHEEL_DIR=work))
        if not _ok(built):
            raise _ItemFailed("build failed: " + _why(built))
        seconds = time.monotonic() - started
        wheel = _the_wheel(transport, work, key)
        _install_and_verify(item, execute, work, wheel, what="the built wheel")
        source = next((line.strip()[len(SOURCE_MARKER):] for line in built.stdout.splitlines()
                       if line.strip().startswith(SOURCE_MARKER)), "build")
        if cache is None:
            why = f"key incomplete: {', '.join(missing)} unknown" if missing else "no wheel cache"
            event("wheel", **record, action="built-not-cached", reason=why, build_seconds=seconds)
            return f"{name}: built in {seconds:.0f} s, not cached ({why})"
        incoming = cache.incoming(wheel.rpartition("/")[2])
        pulled = guest().pull(wheel, incoming, max_bytes=DEFAULT_MAX_BYTES)
        entry = cache.store(key, incoming, built_on=target, build_seconds=round(seconds, 1), source=source)
        event("wheel", **record, action="built", entry=entry.directory.name, sha256=pulled.sha256,
              size=pulled.size, build_seconds=seconds, source=source, rebuild=options.rebuild)
        how = "built" if source == "build" else f"downloaded ({source})"
        return f"{name}: {how} in {seconds:.0f} s, cached as {entry.directory.name}{note}"


@dataclass(frozen=True)
class _Installed:
    line: str


def _from_upstream(item: RenderedItem, key: dict[str, str], execute: Execute, guest: Callable[[], Guest],
                   cache: WheelCache, fetcher: Fetcher, work: str, event: Callable[..., None],
                   record: dict[str, Any]) -> _Installed | str:
    """Upstream's release wheel for exactly this key, downloaded on the controller, installed and import-
    checked here, then cached; or why not (the caller builds). Stored only after it passed on a target,
    so a wheel that does not fit (an older glibc than upstream's build host) never reaches the cache."""
    proposal = candidate(item.upstream, key)
    if isinstance(proposal, str):
        return f"no release wheel: {proposal}"
    incoming = cache.incoming(proposal.install_name)
    try:
        try:
            fetched = fetcher.fetch(proposal.url, incoming, max_bytes=DEFAULT_MAX_BYTES)
        except FetchError as error:
            return error.reason
        problem = wheel_problem(incoming, name=key["name"], version=key["version"], tag=proposal.tag)
        if problem is not None:
            return _refused(fetcher, proposal.url, f"{proposal.filename} refused: {problem}")
        remote = f"{work}/{proposal.install_name}"
        pushed = guest().push(incoming, remote, mode=0o600, max_bytes=max(fetched.size, 1))
        if pushed.sha256 != fetched.sha256:
            return f"{proposal.filename} changed on the controller while it was pushed; not installed"
        try:
            _install_and_verify(item, execute, work, remote, what="upstream's release wheel")
        except _ItemFailed as failure:
            return _refused(fetcher, proposal.url, f"{proposal.filename}: {failure}")
        entry = cache.store(key, incoming, built_on="upstream", build_seconds=None, source=proposal.url)
    finally:
        with contextlib.suppress(OSError):
            incoming.unlink()  # still there unless stored
        with contextlib.suppress(OSError):
            incoming.parent.rmdir()
    event("wheel", **record, action="installed-from-upstream", entry=entry.directory.name,
          url=proposal.url, sha256=entry.sha256, size=entry.size)
    return _Installed(f"installed upstream's release wheel {proposal.filename} (sha256 {entry.sha256[:12]}), "
                      f"cached as {entry.directory.name}")


def _refused(fetcher: Fetcher, url: str, reason: str) -> str:
    """reason, after telling the run's fetcher not to offer url again."""
    fetcher.refuse(url, reason)
    return reason


def _the_wheel(transport: Transport, work: str, key: dict[str, str]) -> str:
    listed = transport.execute(("/bin/sh", "-c", _LIST_WHEELS, "sh", work), timeout=60)
    wheels = [line for line in listed.stdout.splitlines() if line.strip()]
    if len(wheels) != 1:
        raise _ItemFailed(f"the build left {len(wheels)} wheels in {work}, not one")
    names = wheel_name_version(wheels[0].rpartition("/")[2])
    if names != (key["name"], key["version"]):
        made = wheels[0].rpartition("/")[2]
        raise _ItemFailed(f"the build made {made}, not {key['name']} {key['version']}")
    return wheels[0]


def _install_and_verify(item: RenderedItem, execute: Execute, work: str, wheel: str, *, what: str) -> None:
    installed = execute("install", with_env(item.install, FLEETFIX_WHEEL_DIR=work, FLEETFIX_WHEEL=wheel))
    if not _ok(installed):
        raise _ItemFailed(f"installing {what} failed: {_why(installed)}")
    verified = execute("verify", item.verify)
    if not _ok(verified):
        hint = "; --rebuild builds it on this target" if what == "the cached wheel" else ""
        raise _ItemFailed(f"{what} installed but verify failed: {_why(verified)}{hint}")
