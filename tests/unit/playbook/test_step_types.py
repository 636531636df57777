"""The step type registry (fleetfix/playbook/steps/): adding a step type is one module plus its line in
STEP_TYPES. Shown by doing it: a copy of the package gains `steps/touch.py` and its registry line, nothing
else, and a playbook using `touch:` then loads (with the type's own rules and errors), plans, runs in check
mode and for real, and registers what the type says, through the unchanged model, render and runner."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from fleetfix.playbook.model import Step
from fleetfix.playbook.steps import STEP_TYPES

PACKAGE = Path(__file__).resolve().parents[3] / "fleetfix"

TOUCH = '''"""`touch`: a file exists on the target (created empty when it does not)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field

from fleetfix.playbook.render import Compiler, Loc, Renderer, StepFields
from fleetfix.playbook.steps.base import StepCall, StepEnd


class TouchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)


@dataclass(frozen=True)
class Touch:
    key: str = "touch"
    field: str = "touch"
    spec: type[BaseModel] = TouchSpec

    def rules(self, step: StepFields, spec: Any) -> Iterator[tuple[Loc, str]]:
        if step.apply is not None:
            yield ("apply",), "not with touch"
        if not spec.path.startswith("/") and "{{" not in spec.path:
            yield ("touch", "path"), "an absolute path"

    def compile(self, spec: Any, compiler: Compiler) -> jinja2.Template:
        return compiler.text(spec.path, ("touch", "path"))

    def render(self, spec: Any, compiled: jinja2.Template, renderer: Renderer) -> str:
        return renderer.text(compiled, "touch.path")

    def run(self, call: StepCall, path: str) -> StepEnd:
        there = call.execute("verify", f"test -e {shlex.quote(path)}")
        if there.rc == 0:
            return StepEnd("ok", f"{path} exists", there, registered={"path": path})
        if call.check_mode:
            return StepEnd("would-change", f"would create {path}", registered={"path": path})
        refusal = call.before_change()
        if refusal is not None:
            return StepEnd("failed", refusal)
        made = call.execute("apply", f"touch -- {shlex.quote(path)}")
        if made.rc != 0:
            return StepEnd("failed", f"touch: exit {made.rc}", made)
        return StepEnd("changed", f"created {path}", made, registered={"path": path})


TOUCH = Touch()
'''

# Run in the copy: load, refuse, plan and run a playbook with a touch step on this machine.
DRIVER = '''
import json, sys
import fleetfix
from fleetfix.errors import PlaybookError
from fleetfix.playbook import RunContext, parse_playbook, plan_target, run_target
from fleetfix.playbook.render import compile_playbook
from fleetfix.target import NodeRef, Target
from fleetfix.transport.local import LocalTransport

workdir = sys.argv[1]
out = {"package": fleetfix.__file__}
book = parse_playbook(f"""
name: touched
steps:
  - name: marker
    touch:
      path: "{{{{ workdir }}}}/marker"
    register: made
  - name: says where
    check: test -f {{{{ registered.made.path }}}}
""", workdir + "/book.yaml")
errors = {}
for case, text in {
    "apply": "name: x\\nsteps:\\n  - name: s\\n    apply: 'true'\\n    touch: {path: /tmp/x}\\n",
    "relative": "name: x\\nsteps:\\n  - name: s\\n    touch: {path: x}\\n",
    "unknown": "name: x\\nsteps:\\n  - name: s\\n    touch: {path: /x, mode: 1}\\n",
    "two": "name: x\\nsteps:\\n  - name: s\\n    touch: {path: /x}\\n    fetch: {src: /a, dest: b}\\n",
}.items():
    try:
        parse_playbook(text, f"{case}.yaml")
    except PlaybookError as exc:
        errors[case] = str(exc)
out["errors"] = errors
target = Target("local", NodeRef("local", None))
runs = {}
for name, check_mode in (("check", True), ("first", False), ("again", False)):
    plan = plan_target([compile_playbook(book)], target, {}, {"workdir": workdir})
    run = run_target(plan, LocalTransport(), RunContext(check_mode=check_mode))
    runs[name] = [(step.name, step.status, step.reason) for step in run.steps]
out["runs"] = runs
print(json.dumps(out))
'''


def test_the_shipped_types_are_registered_in_the_step_model() -> None:
    assert [kind.key for kind in STEP_TYPES] == ["copy", "fetch", "wheels"]
    aliases = [info.alias or name for name, info in Step.model_fields.items()]
    assert aliases[-3:] == ["copy", "fetch", "wheels"]  # after the common fields, as the registry says


def test_a_new_step_type_is_one_module_plus_its_registry_line(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "fleetfix"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "playbook" / "steps" / "touch.py").write_text(TOUCH)
    registry = copy / "playbook" / "steps" / "__init__.py"
    before = registry.read_text()
    after = before.replace("from fleetfix.playbook.steps import transfer, wheels",
                           "from fleetfix.playbook.steps import touch, transfer, wheels")
    after = after.replace("    wheels.WHEELS,\n", "    wheels.WHEELS,\n    touch.TOUCH,\n")
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-from fleetfix.playbook.steps import transfer, wheels",
                       "+from fleetfix.playbook.steps import touch, transfer, wheels",
                       "+    touch.TOUCH,"]
    registry.write_text(after)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, "-c", DRIVER, str(work)], capture_output=True, text=True,
                          cwd=tmp_path / "src",
                          env={"PYTHONPATH": str(tmp_path / "src"), "PATH": "/usr/bin:/bin"},
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["package"].startswith(str(copy))
    assert out["errors"] == {
        "apply": "apply.yaml:4: steps.0.apply: not with touch",
        "relative": "relative.yaml:4: steps.0.touch.path: an absolute path",
        "unknown": "unknown.yaml:4: steps.0.touch.mode: unknown field (expected one of: path)",
        "two": "two.yaml:4: steps.0.touch: a step is one of copy, fetch, wheels or touch, "
               "not fetch and touch",
    }
    marker = f"{work}/marker"
    assert out["runs"] == {
        "check": [["marker", "would-change", f"would create {marker}"],
                  ["says where", "would-change", "not met before the changes above: exit 1"]],
        "first": [["marker", "changed", f"created {marker}"], ["says where", "ok", "check passed"]],
        "again": [["marker", "ok", f"{marker} exists"], ["says where", "ok", "check passed"]],
    }
