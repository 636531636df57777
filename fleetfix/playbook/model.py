"""The playbook file format: pydantic models, loaded with line numbers so every error is one line.

A playbook is YAML: a name, default vars, optional prerequisite playbooks, and ordered steps. Each step is
check → apply → verify (see docs/playbooks.md), or a transfer (`copy`: controller → target, `fetch`:
target → controller, idempotent by sha256), or `wheels`: build-once-install-everywhere Python wheels
through the controller's wheel cache (docs/extensions.md). Loading validates the shape (unknown keys,
wrong types), then the rules pydantic cannot express (unique names, a step needs check or apply, ...);
load.py then compiles every template (render.py), so a bad playbook fails before any target is contacted.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr

from fleetfix.errors import ConfigError, PlaybookError
from fleetfix.yamlsource import Loc, Locations

# Names the templates see at top level; a var may not take one of them.
RESERVED_NAMES = frozenset({"facts", "vars", "registered", "target", "result", "item"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

EnvValue = str | int | float | bool
_OCTAL_MODE = re.compile(r"^0?[0-7]{3,4}$")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TransferSpec(_Spec):
    """`copy` / `fetch`: src and dest are templates (text, not shell: never quoted). Controller paths are
    relative to the playbook's directory; target paths are absolute."""

    src: str = Field(min_length=1)
    dest: str = Field(min_length=1)
    # A quoted octal string: YAML 1.1 reads an unquoted 0644 as the number 420 and 644 as 644.
    mode: str | None = None
    max_size: int | None = Field(None, gt=0)  # bytes; default guests.transfer.DEFAULT_MAX_BYTES


class WheelsSpec(_Spec):
    """`wheels`: per item, verify → (cache hit: push + install | miss: build + install + fetch) → verify.
    Scripts are templates with `item` in scope; the runner exports FLEETFIX_WHEEL_DIR / FLEETFIX_WHEEL."""

    items: str = Field(min_length=1)  # expression → list; each element is `item` in the templates below
    key: dict[str, str] = Field(default_factory=dict)  # templates; with name + version: the cache key
    describe: str = Field(min_length=1)  # last stdout line: "NAME VERSION" of what the item resolves to
    build: str = Field(min_length=1)  # builds exactly one wheel into $FLEETFIX_WHEEL_DIR
    install: str = Field(min_length=1)  # installs $FLEETFIX_WHEEL
    verify: str = Field(min_length=1)  # exit 0: the item is installed and works (also the item's check)
    # A template rendering, per item, the URL of upstream's prebuilt wheel with the placeholders of
    # fleetfix.wheels.release ({version}, {cuda_major}, ...) filled from the key at run time; empty: none.
    upstream: str | None = None
    # Templates rendering, per item, the controller-side location of the item's source archive (an
    # absolute path, file:// or https:// URL; fleetfix.wheels.source) and the sha256 it must have; empty:
    # none. With a source, the controller takes the archive, names NAME VERSION from it (describe is not
    # run), and the build gets exactly those bytes as $FLEETFIX_SOURCE.
    source: str | None = None
    source_sha256: str | None = None


def _bool_as_expression(value: Any) -> Any:
    """`changed_when: false` is YAML's boolean, not the text "false": take it as the expression it means
    (jinja2 reads `true`/`false` as its booleans), as any template that renders to a boolean would be."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


# when / until / changed_when: a jinja2 expression, or a YAML boolean standing for a constant one.
Expression = Annotated[str, BeforeValidator(_bool_as_expression)]


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    when: Expression | None = None  # jinja2 expression; false → skipped
    check: str | None = None  # script; exit 0 = already in the desired state (must be read-only)
    apply: str | None = None  # script that makes the change
    verify: str | None = None  # script that must exit 0 after apply
    # Upper bounds: beyond them time.sleep and the remote watchdog overflow (issue 18, huge numbers).
    retries: int = Field(0, ge=0, le=1000)  # extra apply attempts
    delay: float = Field(0.0, ge=0, le=86400)  # seconds between apply attempts
    until: Expression | None = None  # expression over `result` (the apply's); default: result.rc == 0
    timeout: float | None = Field(None, gt=0, le=7 * 86400)  # seconds, per script run
    # keep this step's result as registered.<name> ("register" in YAML; the attribute name would
    # shadow pydantic's BaseModel.register)
    register_as: str | None = Field(None, alias="register")
    env: dict[str, EnvValue] = Field(default_factory=dict)  # exported at the top of each script
    ignore_errors: bool = False
    changed_when: Expression | None = None  # expression over `result`; false → the apply counts as no change
    # a file from the controller to the target ("copy" in YAML; the attribute would shadow BaseModel.copy)
    copy_spec: TransferSpec | None = Field(None, alias="copy")
    fetch: TransferSpec | None = None  # a file from the target to the controller
    wheels: WheelsSpec | None = None  # Python wheels built once per cache key, installed everywhere

    @property
    def is_assertion(self) -> bool:
        """Only a check: the step asserts a state and fails when the check fails."""
        return self.apply is None and self.transfer is None and self.wheels is None

    @property
    def transfer(self) -> tuple[str, TransferSpec] | None:
        """("copy" | "fetch", its spec) for a transfer step."""
        if self.copy_spec is not None:
            return "copy", self.copy_spec
        if self.fetch is not None:
            return "fetch", self.fetch
        return None


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    vars: dict[str, Any] = Field(default_factory=dict)  # defaults; string values may be templates
    hosts: str | None = None  # default target selection pattern (the CLI's --limit overrides it)
    requires: list[str] = Field(default_factory=list)  # playbooks run first, paths relative to this file
    # snapshot each container before its first change, as `apply --snapshot` does (docs/snapshots.md)
    snapshot: bool = False
    steps: list[Step] = Field(min_length=1)

    _path: str = PrivateAttr("<playbook>")
    _locations: Locations | None = PrivateAttr(None)
    _required: list[Playbook] = PrivateAttr(default_factory=list)
    _compiled: Any = PrivateAttr(None)  # render.CompiledPlaybook, cached by render.compile_playbook

    @property
    def path(self) -> str:
        return self._path

    def line_of(self, loc: Loc) -> int | None:
        return self._locations.line(loc) if self._locations else None

    def error_at(self, loc: Loc, message: str, cls: type[ConfigError] = PlaybookError) -> ConfigError:
        field = ".".join(str(part) for part in loc) or None
        return cls(message, path=self._path, line=self.line_of(loc), field=field)

    def chain(self) -> list[Playbook]:
        """This playbook's prerequisites (depth first, each once), then itself: the order they run in."""
        ordered: list[Playbook] = []
        seen: set[str] = set()

        def visit(book: Playbook) -> None:
            key = str(Path(book.path).resolve()) if book.path != "<playbook>" else str(id(book))
            if key in seen:
                return
            seen.add(key)
            for required in book._required:
                visit(required)
            ordered.append(book)

        visit(self)
        return ordered


def check_rules(book: Playbook) -> None:
    """The rules a field type cannot say; each error names the offending field."""
    for name in book.vars:
        if name in RESERVED_NAMES or not name.isidentifier() or keyword.iskeyword(name):
            raise book.error_at(("vars", name), "not a usable var name (an identifier, not one of "
                                + ", ".join(sorted(RESERVED_NAMES)) + ")")
    step_names: set[str] = set()
    registers: set[str] = set()
    for index, step in enumerate(book.steps):
        at: Loc = ("steps", index)
        if step.name in step_names:
            raise book.error_at((*at, "name"), f"duplicate step name {step.name!r}")
        step_names.add(step.name)
        specs = (("copy", step.copy_spec), ("fetch", step.fetch), ("wheels", step.wheels))
        kinds = [kind for kind, spec in specs if spec is not None]
        if len(kinds) > 1:
            raise book.error_at((*at, kinds[1]),
                                f"a step is one of copy, fetch or wheels, not {' and '.join(kinds)}")
        if step.transfer is not None:
            _check_transfer(book, at, step)
            continue_checks = False
        elif step.wheels is not None:
            for field in ("apply", "verify", "until", "changed_when"):
                if getattr(step, field) is not None:
                    raise book.error_at((*at, field),
                                        "not with wheels (its own build/install/verify run per item)")
            if step.retries:
                raise book.error_at((*at, "retries"), "not with wheels")
            continue_checks = False
        else:
            continue_checks = True
        if continue_checks and step.check is None and step.apply is None:
            raise book.error_at(at, "a step needs check, apply or both (or is a copy, fetch or wheels step)")
        if continue_checks and step.apply is None:
            for field in ("verify", "until", "changed_when"):
                if getattr(step, field) is not None:
                    raise book.error_at((*at, field), "only meaningful with apply")
            if step.retries:
                raise book.error_at((*at, "retries"), "only meaningful with apply")
        if step.register_as is not None:
            if not step.register_as.isidentifier() or keyword.iskeyword(step.register_as):
                raise book.error_at((*at, "register"), "must be an identifier")
            if step.register_as in registers:
                raise book.error_at((*at, "register"), f"{step.register_as!r} is already registered")
            registers.add(step.register_as)
        for env_name in step.env:
            if not _ENV_NAME.match(env_name):
                raise book.error_at((*at, "env", env_name), "not a valid environment variable name")


def _check_transfer(book: Playbook, at: Loc, step: Step) -> None:
    """A transfer step is only its transfer: no scripts, no retries, no env (nothing runs a script)."""
    assert step.transfer is not None
    kind, spec = step.transfer
    for field in ("check", "apply", "verify", "until", "changed_when"):
        if getattr(step, field) is not None:
            raise book.error_at((*at, field), f"not with {kind} (it checks by sha256 itself)")
    if step.retries:
        raise book.error_at((*at, "retries"), f"not with {kind}")
    if step.env:
        raise book.error_at((*at, "env"), f"not with {kind} (no script runs)")
    if spec.mode is not None and not _OCTAL_MODE.match(spec.mode):
        raise book.error_at((*at, kind, "mode"), 'an octal mode as a quoted string, e.g. "0644"')
