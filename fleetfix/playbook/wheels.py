"""`wheels` steps: build a Python wheel once per binary-compatibility key, install it where it is trusted.

Per item of the step, on one target:

    verify                          exit 0 → already installed, nothing to do
    source (when the item names one) the controller takes the sdist (fleetfix.wheels.source): hashed, its
                                    pin checked (a mismatch fails the item here); NAME VERSION are its file
                                    name's, its sha256 joins the key, and describe is not run
    describe                        last stdout line "NAME VERSION": what the item resolves to here; NAME
                                    must be a PEP 508 name and VERSION a PEP 440 version, or the item fails
    under `wheels: build: never` (Target.wheel_build false): upstream's release wheel or a --wheelhouse
        entry for the key, else the item fails before anything is installed; nothing below
    key = the step's rendered key fields + name + version     (fleetfix.wheels.cache: any empty field →
                                                               built as before, never cached)
    under the cache's lock of (key, this target and the builders it trusts), unless --rebuild:
        this target's own entry, then that of each builder the inventory trusts for this target
        (Target.wheel_builders), then upstream's release wheel's (the controller downloaded it), then a
        --wheelhouse entry for the key (the operator named the directory)    → "installed from cache"
        then, unless --rebuild, the item names upstream's release wheel whose label matches the key
                                 →  the controller downloads it, checks its dist-info, pushes it,
                                    install, verify, and only then stores it with its URL and sha256
                                    ("installed from upstream"); not there, unreachable, or failing the
                                    install or import check → on to the build, nothing cached
        then, for a target the inventory gives a dedicated builder (`wheels: builder:`, Target.wheel_builder):
                                 →  a throw-away clone of its template runs the playbook and builds the key
                                    (playbook/clonebuild.py), stored as `clone:<node>/<template>`; installed
                                    here only if this target's full key equals the clone's ("installed from
                                    cache"), else on to the build, the reason in the recap
        otherwise                →  build into $FLEETFIX_WHEEL_DIR (the source's bytes pushed, as
                                    $FLEETFIX_SOURCE, when the item names one), install, verify, pull the
                                    wheel back and store it as this target's, if it is a compiled
                                    extension for the key (a pure-Python wheel stays on its builder)
                                                                                            ("built")

Who may install whose wheel is the inventory's (`wheels: trust:`, docs/inventory.md), never the key's: the
key is what the targets reported about themselves, so a guest can make its key equal another's. By default
a target installs only wheels it built itself, upstream's release wheels and the operator's wheelhouses.
What the manifest records about provenance (builder, source, build command, the sdist's location and
sha256) is the controller's own; the build's output is only logged.

Ordering across concurrent targets is the locks and nothing else: targets run as the fleet runs them (per
node and --forks). The lock is per key and per set of builders (the target and those it trusts), so
targets that trust the same builders (a group sharing its builds) take turns: the first builds, the others
wait and install its wheel, and a builder that fails releases the key and the next waiter builds; targets
that trust nobody build side by side. A target holds that lock and then perhaps upstream's (never the other
way round), and items are done one by one, so there is no lock cycle. A wheel is only ever installed on
a target whose full key equals the entry's, and only after its sha256 matched its manifest on the
controller and again in the target (Guest.push).

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
from fleetfix.playbook.clonebuild import CloneBuilds
from fleetfix.playbook.render import RenderedItem
from fleetfix.target import Target, WheelBuilder
from fleetfix.transport.base import Transport
from fleetfix.wheels.cache import (
    UPSTREAM,
    CacheEntry,
    Lookup,
    Provenance,
    WheelCache,
    WheelRefused,
    builder_label,
    canonical_name,
    key_digest,
    missing_fields,
    name_problem,
    target_builder,
    version_problem,
    wheel_name_version,
    wheel_problem,
)
from fleetfix.wheels.httpfetch import Fetcher, FetchError
from fleetfix.wheels.release import candidate
from fleetfix.wheels.source import SourceArchive, SourceRefused, Sources

WORK_ROOT = "/var/tmp"  # per item: <WORK_ROOT>/fleetfix-wheels-<random>, 0700, removed afterwards
_LIST_WHEELS = 'for f in "$1"/*.whl; do [ -f "$f" ] && printf "%s\\n" "$f"; done; true'


@dataclass(frozen=True)
class WheelOptions:
    """The controller's side of wheels steps: where the cache is, and whether to ignore it."""

    cache: WheelCache | None = None  # None: build on every target, as without a cache
    rebuild: bool = False  # build even when the cache or a wheelhouse has the key; replace the entry
    # Downloads upstream's release wheels for items that name one (None: never; they are built)
    upstream: Fetcher | None = None
    # Masks the run's secrets in what the cache records (the build command); run_playbook sets it.
    redact: Callable[[str], str] = str
    # The dedicated builders' clones (playbook/clonebuild.py), for targets the inventory gives one; None:
    # every target builds what it lacks (check mode, or no guest drivers). run_playbook sets it.
    clones: CloneBuilds | None = None
    # Whose builds the wheels built here are in the cache: None, the target's; a clone's run sets its
    # dedicated builder's id (`clone:<node>/<template>`).
    builder: str | None = None
    # The run's source archives (items with a `source:`), taken on the controller once per location;
    # run_playbook makes one when none is given, and removes its files at the end.
    sources: Sources | None = None


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


class WheelsCall(Protocol):
    """One wheels step on one target, as the step runs it (the runner's StepCall is one): its scripts run
    through execute (recorded), files move through guest(), and each item's outcome is an event."""

    @property
    def target(self) -> Target: ...
    @property
    def transport(self) -> Transport: ...  # into the target
    @property
    def wheels(self) -> WheelOptions: ...  # the controller's wheel cache and its options

    def execute(self, phase: WheelPhase, script: str) -> ScriptResult: ...
    def guest(self) -> Guest: ...
    def event(self, kind: str, /, **fields: Any) -> None: ...


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


def run_wheels(items: list[RenderedItem], call: WheelsCall) -> WheelsOutcome:
    """Every item in order; the first failing item fails the step (later items are not tried)."""
    outcome = WheelsOutcome("ok")
    for item in items:
        name = label(item.item)
        if _ok(call.execute("verify", item.verify)):
            outcome.lines.append(f"{name}: already installed")
            continue
        try:
            outcome.lines.append(_one(item, call))
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


def _one(item: RenderedItem, call: WheelsCall) -> str:
    execute, transport, options, target, event = (call.execute, call.transport, call.wheels, call.target,
                                                  call.event)
    source = _source(item, options)
    key = _source_key(item, source) if source is not None else _described_key(item, execute)
    name = f"{key['name']} {key['version']}"
    missing = missing_fields(key)
    cache = options.cache if not missing else None
    record: dict[str, Any] = {"item": name, "key": key, "missing": missing, "refused": []}
    if source is not None:
        record["sdist"] = {"location": source.shown, "sha256": source.sha256, "size": source.size}
    item_run = _ItemRun(item, execute, transport, call.guest, event, record, options.redact, source=source)
    if not target.wheel_build:
        return _prebuilt_only(item_run, key, cache, options)
    with _work_dir(transport) as work:
        item_run.work = work
        if cache is None:
            seconds, _ = item_run.build()
            why = f"key incomplete: {', '.join(missing)} unknown" if missing else "no wheel cache"
            event("wheel", **record, action="built-not-cached", reason=why, build_seconds=seconds)
            return f"{name}: built in {seconds:.0f} s, not cached ({why})"
        own = options.builder or target_builder(target.name)
        trusted = [target_builder(other) for other in sorted(target.wheel_builders - {target.name})]
        dedicated = target.wheel_builder if options.builder is None else None
        if dedicated is not None:
            trusted.append(dedicated.builder_id)
        record["trusted_builders"] = [builder_label(builder) for builder in trusted]
        # One lock for everyone who trusts the same builders: a group sharing its builds takes turns, so
        # the first builds and the others find its entry. Nobody waits for a build they would not install.
        with cache.lock(key, "\n".join(sorted([own, *trusted]))):
            if not options.rebuild:
                for builder in (own, *trusted, UPSTREAM):
                    installed = item_run.from_entry(cache.lookup(key, builder))
                    if installed is not None:
                        return installed
                installed = item_run.from_entry(cache.lookup_wheelhouses(key))
                if installed is not None:
                    return installed
            # A named source is what must be built: upstream's wheel was built from upstream's.
            if item.upstream and options.upstream is not None and not options.rebuild and source is None:
                with cache.lock(key, UPSTREAM):  # after the first: the one order both locks are taken in
                    installed = item_run.from_entry(cache.lookup(key, UPSTREAM))  # fetched meanwhile?
                    if installed is not None:
                        return installed
                    got = _from_upstream(item, key, item_run, cache, options.upstream)
                if isinstance(got, _Installed):
                    return f"{name}: {got.line}{item_run.note}"
                record["upstream"] = got
                item_run.upstream_note = f" (upstream: {got})"
            if dedicated is not None and options.clones is not None:
                installed = _from_clone(dedicated, key, item_run, cache, options, target)
                if installed is not None:
                    return installed
            return item_run.build_and_store(cache, own, rebuild=options.rebuild)


def _source(item: RenderedItem, options: WheelOptions) -> SourceArchive | None:
    """The item's source archive on the controller, or None when it names none; refused (a pin that
    differs, a location that is not one) before anything runs on the target."""
    if not item.source:
        return None
    if options.sources is None:
        raise _ItemFailed("source refused: this run takes no source archives")
    try:
        return options.sources.take(item.source, item.source_sha256, options.cache)
    except SourceRefused as refused:
        raise _ItemFailed(f"source refused: {refused}") from None


def _source_key(item: RenderedItem, source: SourceArchive) -> dict[str, str]:
    """The item's key when the controller holds its source: NAME VERSION from the archive, and its sha256
    (a wheel is only ever installed where exactly this source is wanted)."""
    return {**item.key, "name": source.name, "version": source.version, "sdist_sha256": source.sha256}


def _prebuilt_only(item_run: _ItemRun, key: dict[str, str], cache: WheelCache | None,
                   options: WheelOptions) -> str:
    """The inventory's `wheels: build: never`: upstream's verified release wheel (cached, or downloaded
    now) or a --wheelhouse entry for exactly this key, else refused before anything is installed or
    built here."""
    item, record = item_run.item, item_run.record
    never = "the inventory says wheels: build: never (the CI wheelhouse only)"
    if options.rebuild:
        raise _ItemFailed(f"--rebuild asks for a build, and {never}; nothing changed")
    if cache is None:
        missing = record["missing"]
        why = f"key incomplete: {', '.join(missing)} unknown" if missing else "no wheel cache"
        raise _ItemFailed(f"no wheel ({why}), and {never}; nothing changed")
    with _work_dir(item_run.transport) as work:
        item_run.work = work
        with cache.lock(key, UPSTREAM):
            for found in (cache.lookup(key, UPSTREAM), cache.lookup_wheelhouses(key)):
                installed = item_run.from_entry(found)
                if installed is not None:
                    return installed
            if item.upstream and options.upstream is not None and item_run.source is None:
                got = _from_upstream(item, key, item_run, cache, options.upstream)
                if isinstance(got, _Installed):
                    return f"{item_run.name}: {got.line}{item_run.note}"
                record["upstream"] = got
                item_run.upstream_note = f" (upstream: {got})"
    entry = WheelCache.entry_name(key, "")[:-16]  # <name>-<version>-
    item_run.event("wheel", **record, action="refused-no-build", reason=never)
    raise _ItemFailed(f"no wheel for this key in the wheelhouses or upstream's release wheels, and {never}; "
                      f"nothing changed: build it in CI for this key (key digest {key_digest(key)[:16]}, "
                      f"fields in the run's wheel event) into a wheelhouse, then pass --wheelhouse DIR "
                      f"({entry}*){item_run.note}{item_run.upstream_note}")


def _from_clone(spec: WheelBuilder, key: dict[str, str], item_run: _ItemRun, cache: WheelCache,
                options: WheelOptions, target: Target) -> str | None:
    """Have a clone of the dedicated builder build the key, then install its entry here: the recap line, or
    None (the reason noted) when there is no entry for exactly this target's key, and it builds for itself."""
    assert options.clones is not None
    outcome = options.clones.build(spec, key, cache, variables=target.vars, rebuild=options.rebuild)
    why, left = outcome.why, outcome.left
    item_run.record["dedicated_builder"] = {"builder": spec.builder_id, "why_not": why, "left": left}
    if why is None:
        installed = item_run.from_entry(cache.lookup(key, spec.builder_id))
        if installed is not None:
            return installed + (f" ({left})" if left else "")
        why = "its entry is not in the cache"
    item_run.upstream_note += f" (dedicated builder {spec.builder_id}: {why}; built here)"
    if left:
        item_run.upstream_note += f" ({left})"
    return None


def _described_key(item: RenderedItem, execute: Execute) -> dict[str, str]:
    """The item's key: the step's fields, and NAME VERSION from describe's last line, which the target
    printed: kept as text only once they are a distribution name and a version."""
    described = execute("describe", item.describe)
    words = (described.stdout.strip().splitlines() or [""])[-1].split()
    if not _ok(described) or len(words) != 2:
        got = " ".join(words)[:120]
        raise _ItemFailed("describe failed: " + (_why(described) if not _ok(described)
                                                 else f"expected 'NAME VERSION', got {got!r}"))
    problem = name_problem(words[0]) or version_problem(words[1])
    if problem is not None:
        raise _ItemFailed(f"describe failed: {problem}")
    return {**item.key, "name": canonical_name(words[0]), "version": words[1]}


@dataclass
class _ItemRun:
    """One item on one target: installing an entry, or building (and storing) a wheel."""

    item: RenderedItem
    execute: Execute
    transport: Transport
    open_guest: Callable[[], Guest]  # the target's guest driver, made on first use
    event: Callable[..., None]
    record: dict[str, Any]
    redact: Callable[[str], str] = str
    source: SourceArchive | None = None  # the controller's copy of the item's source, if it names one
    work: str = ""
    upstream_note: str = ""

    @property
    def name(self) -> str:
        return str(self.record["item"])

    @property
    def note(self) -> str:
        refused = self.record["refused"]
        return f" (refused: {'; '.join(refused)})" if refused else ""

    def from_entry(self, found: Lookup) -> str | None:
        """Install found's entry here, and say so; None when there is none (its refusals are noted)."""
        self.record["refused"].extend(found.refused)
        if found.entry is None:
            return None
        entry = found.entry
        remote = f"{self.work}/{entry.wheel}"
        pushed = self.open_guest().push(entry.path, remote, mode=0o600, max_bytes=max(entry.size, 1))
        if pushed.sha256 != entry.sha256:  # changed on the controller since the lookup re-hashed it
            raise _ItemFailed(f"{entry.directory.name} changed while it was pushed; not installed")
        _install_and_verify(self.item, self.execute, self.work, remote, what="the cached wheel")
        self.event("wheel", **self.record, action="installed-from-cache", entry=entry.directory.name,
                   sha256=pushed.sha256, size=pushed.size, built_on=entry.built_on)
        return (f"{self.name}: installed from the wheel cache ({entry.directory.name}, built on "
                f"{entry.built_on}, sha256 {entry.sha256[:12]}){self.note}")

    def build(self) -> tuple[float, str]:
        """Build here, install, verify: (seconds, the wheel's path in the target)."""
        started = time.monotonic()
        values = {"FLEETFIX_WHEEL_DIR": self.work}
        if self.source is not None:
            values["FLEETFIX_SOURCE"] = self._push_source(self.source)
        built = self.execute("build", with_env(self.item.build, **values))
        if not _ok(built):
            raise _ItemFailed("build failed: " + _why(built))
        seconds = time.monotonic() - started
        wheel = _the_wheel(self.transport, self.work, self.record["key"])
        _install_and_verify(self.item, self.execute, self.work, wheel, what="the built wheel")
        return seconds, wheel

    def _push_source(self, source: SourceArchive) -> str:
        """Exactly the controller's bytes of the source, in the work directory: their path there."""
        remote = f"{self.work}/{source.filename}"
        pushed = self.open_guest().push(source.path, remote, mode=0o600, max_bytes=max(source.size, 1))
        if pushed.sha256 != source.sha256:
            raise _ItemFailed(f"{source.filename} changed on the controller while it was pushed; not built")
        return remote

    def build_and_store(self, cache: WheelCache, builder: str, *, rebuild: bool) -> str:
        """Build, install and verify here, then keep the wheel as builder's: unless it is not a compiled
        extension for the key, which stays on this target only."""
        seconds, wheel = self.build()
        incoming = cache.incoming(wheel.rpartition("/")[2])
        try:
            pulled = self.open_guest().pull(wheel, incoming, max_bytes=DEFAULT_MAX_BYTES)
            source = self.source
            provenance = Provenance(builder, "build", round(seconds, 1),
                                    build_command=self.redact(self.item.build),
                                    sdist_sha256=source.sha256 if source is not None else None,
                                    sdist=self.redact(source.shown) if source is not None else None)
            entry: CacheEntry = cache.store(self.record["key"], incoming, provenance)
        except WheelRefused as refused:
            self.event("wheel", **self.record, action="built-not-cached", reason=str(refused),
                       build_seconds=seconds)
            return (f"{self.name}: built in {seconds:.0f} s, not cached ({refused})"
                    f"{self.note}{self.upstream_note}")
        finally:
            with contextlib.suppress(OSError):
                incoming.unlink()  # still there unless stored
            with contextlib.suppress(OSError):
                incoming.parent.rmdir()
        self.event("wheel", **self.record, action="built", entry=entry.directory.name, sha256=pulled.sha256,
                   size=pulled.size, build_seconds=seconds, source="build", rebuild=rebuild)
        return (f"{self.name}: built in {seconds:.0f} s, cached as {entry.directory.name}"
                f"{self.note}{self.upstream_note}")


@dataclass(frozen=True)
class _Installed:
    line: str


def _from_upstream(item: RenderedItem, key: dict[str, str], item_run: _ItemRun, cache: WheelCache,
                   fetcher: Fetcher) -> _Installed | str:
    """Upstream's release wheel for exactly this key, downloaded on the controller, installed and import-
    checked here, then cached as upstream's; or why not (the caller builds). Stored only after it passed on
    a target, so a wheel that does not fit (an older glibc than upstream's build host) never reaches the
    cache. The caller holds the key's UPSTREAM lock."""
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
        remote = f"{item_run.work}/{proposal.install_name}"
        pushed = item_run.open_guest().push(incoming, remote, mode=0o600, max_bytes=max(fetched.size, 1))
        if pushed.sha256 != fetched.sha256:
            return f"{proposal.filename} changed on the controller while it was pushed; not installed"
        try:
            _install_and_verify(item, item_run.execute, item_run.work, remote,
                                what="upstream's release wheel")
        except _ItemFailed as failure:
            return _refused(fetcher, proposal.url, f"{proposal.filename}: {failure}")
        try:
            entry = cache.store(key, incoming, Provenance(UPSTREAM, proposal.url))
        except WheelRefused as refused:
            return _refused(fetcher, proposal.url, f"{proposal.filename} refused: {refused}")
    finally:
        with contextlib.suppress(OSError):
            incoming.unlink()  # still there unless stored
        with contextlib.suppress(OSError):
            incoming.parent.rmdir()
    item_run.event("wheel", **item_run.record, action="installed-from-upstream", entry=entry.directory.name,
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
