"""`wheels`: Python wheels built once per cache key and installed everywhere (playbook/wheels.py does it,
docs/extensions.md says how). Per item: verify → (cache hit: push + install | miss: build + install + fetch)
→ verify. Its scripts are templates with `item` in scope."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field

from fleetfix.errors import TransferError
from fleetfix.playbook.render import Compiler, Loc, RenderedItem, Renderer, StepFields, scoped
from fleetfix.playbook.steps.base import StepCall, StepEnd
from fleetfix.playbook.wheels import label, run_wheels

SCRIPTS = ("describe", "build", "install", "verify")
TEXTS = ("upstream", "source", "source_sha256")  # per-item text templates
_KEY_FIELD = re.compile(r"^[a-z][a-z0-9_]*$")


class WheelsSpec(BaseModel):
    """Scripts are templates with `item` in scope; the runner exports FLEETFIX_WHEEL_DIR / FLEETFIX_WHEEL."""

    model_config = ConfigDict(extra="forbid")

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


@dataclass
class CompiledWheels:
    items: Any  # jinja2 TemplateExpression
    key: dict[str, jinja2.Template]
    scripts: dict[str, jinja2.Template]  # SCRIPTS
    texts: dict[str, jinja2.Template]  # those of TEXTS the step gives


@dataclass(frozen=True)
class Wheels:
    key: str = "wheels"
    field: str = "wheels"
    spec: type[BaseModel] = WheelsSpec

    def rules(self, step: StepFields, spec: Any) -> Iterator[tuple[Loc, str]]:
        for field in ("apply", "verify", "until", "changed_when"):
            if getattr(step, field) is not None:
                yield (field,), "not with wheels (its own build/install/verify run per item)"
        if step.retries:
            yield ("retries",), "not with wheels"

    def compile(self, spec: Any, compiler: Compiler) -> CompiledWheels:
        items = compiler.expression(spec.items, ("wheels", "items"))
        key: dict[str, jinja2.Template] = {}
        for name, value in spec.key.items():
            if name in ("name", "version") or not _KEY_FIELD.match(name):
                raise compiler.error(("wheels", "key", name), "a key field is an identifier other than name "
                                     "and version (those come from describe)")
            key[name] = compiler.text(value, ("wheels", "key", name))
        scripts = {field: compiler.script(getattr(spec, field), ("wheels", field)) for field in SCRIPTS}
        texts = {name: compiler.text(getattr(spec, name), ("wheels", name))
                 for name in TEXTS if getattr(spec, name) is not None}
        return CompiledWheels(items, key, scripts, texts)

    def render(self, spec: Any, compiled: CompiledWheels, renderer: Renderer) -> list[RenderedItem]:
        items = renderer.evaluate(compiled.items, "wheels.items")
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
            raise renderer.error("wheels.items", TypeError(f"items is a list, not {type(items).__name__}"))
        rendered: list[RenderedItem] = []
        for item in items:
            extra = {"item": scoped(item, "item")}
            key = {name: renderer.text(template, f"wheels.key.{name}", extra).strip()
                   for name, template in compiled.key.items()}
            scripts = {field: renderer.exports + renderer.text(template, f"wheels.{field}", extra)
                       for field, template in compiled.scripts.items()}
            texts = dict.fromkeys(TEXTS, "")
            for name, template in compiled.texts.items():
                texts[name] = renderer.text(template, f"wheels.{name}", extra).strip()
            rendered.append(RenderedItem(item, key, scripts["describe"], scripts["build"], scripts["install"],
                                         scripts["verify"], **texts))
        return rendered

    def run(self, call: StepCall, rendered: list[RenderedItem]) -> StepEnd:
        if call.check_mode:
            return self._check(call, rendered)
        refusal = call.before_change()  # the first change on this target: snapshot it first
        if refusal is not None:
            return StepEnd("failed", refusal, call.last_run)
        try:
            outcome = run_wheels(rendered, call)
        except TransferError as exc:
            return StepEnd("failed", str(exc), call.last_run)
        if outcome.status == "failed":
            return StepEnd("failed", outcome.reason, call.last_run)
        return StepEnd("changed" if outcome.status == "changed" else "ok", outcome.reason, call.last_run,
                       stdout="\n".join(outcome.lines) + "\n")

    @staticmethod
    def _check(call: StepCall, rendered: list[RenderedItem]) -> StepEnd:
        """Check mode: each item's verify (read-only), nothing else (not describe: resolving a source tree's
        metadata writes into it)."""
        missing = [label(item.item) for item in rendered
                   if (run := call.execute("verify", item.verify)).rc != 0 or run.timed_out]
        if not missing:
            return StepEnd("ok", "every item verifies")
        return StepEnd("would-change", "would install from the wheel cache or build: " + ", ".join(missing))


WHEELS = Wheels()
