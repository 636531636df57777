"""The playbook file format: pydantic models, loaded with line numbers so every error is one line.

A playbook is YAML: a name, default vars, optional prerequisite playbooks, and ordered steps. Each step is
check → apply → verify (see docs/playbooks.md), or of one of the step types of steps/ (`copy`, `fetch`,
`wheels`, ...), named by its key. The Step model is made from that registry: its common fields, then one
optional field per step type. Loading validates the shape (unknown keys, wrong types), then the rules
pydantic cannot express (unique names, a step needs check or apply, what a step type allows, ...); load.py
then compiles every template (render.py), so a bad playbook fails before any target is contacted.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, create_model

from fleetfix.errors import ConfigError, PlaybookError
from fleetfix.playbook.render import RESERVED_NAMES
from fleetfix.playbook.steps import STEP_TYPES, StepType
from fleetfix.yamlsource import Loc, Locations

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

EnvValue = str | int | float | bool


def _bool_as_expression(value: Any) -> Any:
    """`changed_when: false` is YAML's boolean, not the text "false": take it as the expression it means
    (jinja2 reads `true`/`false` as its booleans), as any template that renders to a boolean would be."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


# when / until / changed_when: a jinja2 expression, or a YAML boolean standing for a constant one.
Expression = Annotated[str, BeforeValidator(_bool_as_expression)]


class StepBase(BaseModel):
    """The fields every step has; Step adds one per step type."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    when: Expression | None = None  # jinja2 expression; false → skipped
    check: str | None = None  # script; exit 0 = already in the desired state (must be read-only)
    # template over facts and vars; rendered to text at plan time, the step is known to be in its desired
    # state from the facts (the text is its reason) while nothing on the target has changed; else check runs
    facts_check: str | None = None
    apply: str | None = None  # script that makes the change
    verify: str | None = None  # script that must exit 0 after apply
    # Upper bounds: with huge numbers time.sleep and the remote watchdog overflow.
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

    @property
    def action(self) -> tuple[StepType, Any] | None:
        """A typed step's type and its spec (the first, when a bad step has two: load refuses it)."""
        for kind in STEP_TYPES:
            spec = getattr(self, kind.field, None)
            if spec is not None:
                return kind, spec
        return None

    @property
    def is_assertion(self) -> bool:
        """Only a check: the step asserts a state and fails when the check fails."""
        return self.apply is None and self.action is None


def _step_model() -> type[StepBase]:
    """Step: the common fields, then each step type's key, in the registry's order."""
    fields: dict[str, Any] = {
        kind.field: (kind.spec | None, Field(None, alias=kind.key if kind.key != kind.field else None))
        for kind in STEP_TYPES}
    return create_model("Step", __base__=StepBase, __module__=__name__, **fields)


if TYPE_CHECKING:
    Step = StepBase
else:
    Step = _step_model()


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
        typed = [kind.key for kind in STEP_TYPES if getattr(step, kind.field, None) is not None]
        if len(typed) > 1:
            raise book.error_at((*at, typed[1]), f"a step is one of {_one_of()}, not {' and '.join(typed)}")
        action = step.action
        if action is not None:
            kind, spec = action
            for where, message in kind.rules(step, spec):
                raise book.error_at((*at, *where), message)
        elif step.check is None and step.apply is None:
            raise book.error_at(at, f"a step needs check, apply or both (or is a {_one_of()} step)")
        elif step.apply is None:
            for field in ("verify", "until", "changed_when"):
                if getattr(step, field) is not None:
                    raise book.error_at((*at, field), "only meaningful with apply")
            if step.retries:
                raise book.error_at((*at, "retries"), "only meaningful with apply")
        if step.facts_check is not None and step.check is None:
            raise book.error_at((*at, "facts_check"), "needs check: it runs when the facts cannot tell")
        if step.facts_check is not None and step.register_as is not None:
            raise book.error_at((*at, "facts_check"),
                                "not with register: a step known from the facts runs no check to register")
        if step.register_as is not None:
            if not step.register_as.isidentifier() or keyword.iskeyword(step.register_as):
                raise book.error_at((*at, "register"), "must be an identifier")
            if step.register_as in registers:
                raise book.error_at((*at, "register"), f"{step.register_as!r} is already registered")
            registers.add(step.register_as)
        for env_name in step.env:
            if not _ENV_NAME.match(env_name):
                raise book.error_at((*at, "env", env_name), "not a valid environment variable name")


def _one_of() -> str:
    """The step types, as a sentence names them: "copy, fetch or wheels"."""
    keys = [kind.key for kind in STEP_TYPES]
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " or " + keys[-1]
