"""What a step type is: the one interface between a step type's module and the model, the templates and
the runner, none of which names a step type.

A step that names no type is a script step (check / apply / verify, the runner's own protocol). A typed
step has its type's key in YAML (`copy:`, `fetch:`, `wheels:`) and that key's value is the type's spec.
Per type:
- model: `spec`, the pydantic model of that value, and `rules()`, what it says about the step's other fields
  (a transfer runs no script, so `apply` is refused);
- templates: `compile()` at load time through a `Compiler`, `render()` per target through a `Renderer`
  (render.py); every template error names file, line and field;
- running: `run()` gets a `StepCall` once the step's own `check` (if it has one and the type allows it) has
  not passed, in check mode too, and returns a `StepEnd`. A type that changes the target asks
  `call.before_change()` first: that is where the snapshot is taken.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

from fleetfix.errors import TransportError
from fleetfix.playbook.render import Compiler, Loc, Renderer, StepFields
from fleetfix.playbook.wheels import ScriptResult, WheelOptions
from fleetfix.target import Target
from fleetfix.transport.base import Transport

if TYPE_CHECKING:
    from fleetfix.guests.base import Guest

EndStatus = Literal["ok", "changed", "would-change", "failed"]


@dataclass(frozen=True)
class StepEnd:
    """How a typed step ended. run: the script run that decided it, if one did (its rc and output are the
    step's); stdout: what the step shows instead of that run's output; registered: what the type adds to
    the step's `registered.<name>` (and its record)."""

    status: EndStatus
    reason: str
    run: ScriptResult | None = None
    stdout: str | None = None
    registered: Mapping[str, Any] = field(default_factory=dict)


class StepCall(Protocol):
    """One typed step on one target, as the runner offers it to the type's run()."""

    @property
    def check_mode(self) -> bool: ...  # the dry run: change nothing, say what would change
    @property
    def would_change_before(self) -> bool: ...  # in check mode: an earlier step would have changed things
    @property
    def target(self) -> Target: ...
    @property
    def transport(self) -> Transport: ...  # into the target
    @property
    def wheels(self) -> WheelOptions: ...  # the controller's wheel cache

    @property
    def last_run(self) -> ScriptResult | None: ...  # the step's last script run so far

    def execute(self, phase: str, script: str, attempt: int = 1) -> ScriptResult:
        """Run one of the step's scripts on the target: recorded, streamed, its timeout applied. A lost
        connection ends the target (unreachable); it does not come back here."""
        ...

    def guest(self) -> Guest:
        """The target's guest driver (files move with it); raises TransferError when the run has none."""
        ...

    def before_change(self) -> str | None:
        """Asked right before the step first changes the target: takes the snapshot when the run takes one.
        A string is the refusal: the step must fail with it and change nothing."""
        ...

    def event(self, kind: str, /, **fields: Any) -> None:
        """One event in the run's record, with the target, playbook and step added."""
        ...

    def lost(self, reason: str, error: TransportError) -> Exception:
        """What to raise when the target was lost mid-step (the step fails with reason, the target is
        unreachable)."""
        ...


class StepType(Protocol):
    """One kind of step. `key` is its YAML key, `field` the attribute of model.Step holding its spec (the key
    unless pydantic's BaseModel already has an attribute of that name)."""

    @property
    def key(self) -> str: ...
    @property
    def field(self) -> str: ...
    @property
    def spec(self) -> type[BaseModel]: ...

    def rules(self, step: StepFields, spec: Any) -> Iterator[tuple[Loc, str]]:
        """What is wrong with the step's fields at load time: (where, relative to the step; message)."""
        ...

    def compile(self, spec: Any, compiler: Compiler) -> Any:
        """The spec's templates, compiled and checked once."""
        ...

    def render(self, spec: Any, compiled: Any, renderer: Renderer) -> Any:
        """What compile() returned, rendered for one target: what run() gets."""
        ...

    def run(self, call: StepCall, rendered: Any) -> StepEnd: ...
