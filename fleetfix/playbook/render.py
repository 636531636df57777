"""Templating for playbooks: jinja2, sandboxed, strict, and shell-safe by default.

Two kinds of template:
- **scripts** (check / apply / verify): every `{{ value }}` is shell-quoted on output, by the environment's
  `finalize`, so a value is always one literal shell word (a list becomes several words). `{{ x | raw }}`
  opts out; `{{ x | quote }}` quotes explicitly (the same function). Because a quoted word inside shell
  quotes or a here-document would break out of them, such a placement is rejected at load time unless
  it is `| raw`.
- **text** (env values, var defaults) and **expressions** (`when`, `until`, `changed_when`): plain jinja2,
  no quoting. Env values are quoted once, when exported at the top of the script.

Names in scope: `facts`, `vars`, `registered`, `target`, every var at top level too, and `result` in
`until` / `changed_when`. Undefined names raise (StrictUndefined) and become TemplateErrors naming file,
step, field and the dotted path of what was missing.

When templates render (see docs/playbooks.md): everything renders per target **before any step runs**,
except a step that mentions `registered` (in any field) — that step renders just before it runs, because
its input does not exist earlier. Loading checks that every `registered.X` names an earlier step's
register, so that late rendering cannot fail for want of a registered result.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import SandboxedEnvironment

from fleetfix.errors import ConfigError, PlaybookError, TemplateError

# Names the templates see at top level; a var may not take one of them.
RESERVED_NAMES = frozenset({"facts", "vars", "registered", "target", "result", "item"})
SCRIPT_FIELDS = ("check", "apply", "verify")
EXPRESSION_FIELDS = ("when", "until", "changed_when")
_RESULT_FIELDS = ("until", "changed_when")  # the only fields that see `result`


# --- quoting ---------------------------------------------------------------------------------------

class Raw(str):
    """Text that goes into a script exactly as it is (already quoted, or trusted by the author)."""

    __slots__ = ()


def shell_quote(value: Any) -> Raw:
    """The one place a template value becomes shell text: one quoted word, or one per list item."""
    if isinstance(value, Raw):
        return value
    if value is None:
        return Raw("''")
    if isinstance(value, list | tuple):
        return Raw(" ".join(shlex.quote(_as_text(item)) for item in value))
    return Raw(shlex.quote(_as_text(value)))


def _as_text(value: Any) -> str:
    return "" if value is None else str(value)


def _raw_filter(value: Any) -> Raw:
    return Raw(_as_text(value))


def _bool_filter(value: Any) -> bool:
    """Like Ansible's `bool`: "false", "no", "0", "off" and "" are false (a --var arrives as a string)."""
    if isinstance(value, str):
        return value.strip().lower() in {"true", "yes", "y", "1", "on"}
    return bool(value)


def _finalize_script(value: Any) -> str:
    return shell_quote(value)


# --- scope -----------------------------------------------------------------------------------------

class ScopeDict(dict[str, Any]):
    """A dict that knows its dotted path, so an undefined key is reported as `facts.os.nvidia_distro`."""

    scope_path: str = ""


def scoped(value: Any, path: str) -> Any:
    """Copy value, turning every mapping into a ScopeDict that knows where it is."""
    if isinstance(value, Mapping):
        copy = ScopeDict({str(key): scoped(item, f"{path}.{key}") for key, item in value.items()})
        copy.scope_path = path
        return copy
    if isinstance(value, list | tuple):
        return [scoped(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return value


class NamedStrictUndefined(jinja2.StrictUndefined):
    @property
    def _undefined_message(self) -> str:
        path = getattr(self._undefined_obj, "scope_path", "")
        if path and isinstance(self._undefined_name, str) and not self._undefined_hint:
            return f"{path}.{self._undefined_name} is undefined"
        return super()._undefined_message


def _environment(*, script: bool) -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        undefined=NamedStrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize_script if script else None,
    )
    env.filters["quote"] = shell_quote
    env.filters["raw"] = _raw_filter
    env.filters["bool"] = _bool_filter
    return env


SCRIPT_ENV = _environment(script=True)
TEXT_ENV = _environment(script=False)

# Errors a template can raise while rendering that are the author's (or the data's) fault, not ours.
_KEY_FIELD = re.compile(r"^[a-z][a-z0-9_]*$")
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
                  ZeroDivisionError)


# --- load-time checks ------------------------------------------------------------------------------

class _ShellContext:
    """Follows, roughly, where in a POSIX sh script the next character lands: plain words, inside
    quotes, a here-document body, or a comment. Good enough to catch `"{{ x }}"` and `'...{{ x }}...'`,
    where an auto-quoted value would end the author's quotes and let its content reach the shell."""

    _HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)[ \t]*(['\"]?)\\?([A-Za-z_][A-Za-z0-9_]*)\2")

    def __init__(self) -> None:
        self.stack = ["plain"]  # plain | single | double | subst | backtick
        self.comment = False
        self.escape = False
        self.prev = ""
        self.line = ""
        self.pending: list[tuple[str, bool]] = []
        self.heredoc: tuple[str, bool] | None = None

    def feed(self, text: str) -> None:
        for char in text:
            if char == "\n":
                self._newline()
            else:
                self.line += char
                if not self.heredoc and not self.comment:
                    self._char(char)
                self.prev = char

    def expression(self) -> None:
        self.line += "\0"  # a value: this line can no longer be a heredoc delimiter
        self.prev = "x"
        self.escape = False

    def enclosure(self) -> str | None:
        """What an expression here would sit inside, if anything that auto-quoting would break."""
        if self.heredoc:
            return "a here-document"
        if self.comment:
            return None
        return {"single": "single quotes", "double": "double quotes"}.get(self.stack[-1])

    def _char(self, char: str) -> None:
        top = self.stack[-1]
        if self.escape:
            self.escape = False
        elif top == "single":
            if char == "'":
                self.stack.pop()
        elif top == "double":
            if char == "\\":
                self.escape = True
            elif char == '"':
                self.stack.pop()
            elif char == "(" and self.prev == "$":
                self.stack.append("subst")
            elif char == "`":
                self.stack.append("backtick")
        elif char == "\\":
            self.escape = True
        elif char == "'":
            self.stack.append("single")
        elif char == '"':
            self.stack.append("double")
        elif char == "`":
            if top == "backtick":
                self.stack.pop()
            else:
                self.stack.append("backtick")
        elif char == "(" and self.prev == "$":
            self.stack.append("subst")
        elif char == ")" and top == "subst":
            self.stack.pop()
        elif char == "#" and (self.prev == "" or self.prev.isspace() or self.prev in ";&|("):
            self.comment = True

    def _newline(self) -> None:
        line, self.line = self.line, ""
        self.comment = False
        self.escape = False
        self.prev = "\n"
        if self.heredoc:
            delimiter, strip_tabs = self.heredoc
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                self.heredoc = self.pending.pop(0) if self.pending else None
            return
        if self.stack[-1] not in ("single", "double"):
            for match in self._HEREDOC.finditer(line):
                self.pending.append((match.group(3), match.group(1) == "-"))
            if self.pending:
                self.heredoc = self.pending.pop(0)


def _quoting_problems(source: str) -> list[tuple[int, str, str]]:
    """(template line, expression, enclosure) for every auto-quoted `{{ }}` inside quotes/heredocs."""
    problems: list[tuple[int, str, str]] = []
    shell = _ShellContext()
    expression: list[tuple[str, str]] | None = None
    start_line = 0
    for lineno, kind, value in SCRIPT_ENV.lex(source):
        if expression is not None:
            if kind == "variable_end":
                significant = [(k, v) for k, v in expression if k != "whitespace"]
                is_raw = (len(significant) >= 2 and significant[-2] == ("operator", "|")
                          and significant[-1] == ("name", "raw"))
                where = shell.enclosure()
                if where and not is_raw:
                    problems.append((start_line, "".join(v for _, v in expression).strip(), where))
                shell.expression()
                expression = None
            else:
                expression.append((kind, value))
        elif kind == "variable_begin":
            expression, start_line = [], lineno
        elif kind == "data":
            shell.feed(value)
    return problems


def _registered_refs(ast: nodes.Template) -> tuple[bool, set[str]]:
    """Whether a template mentions `registered`, and which registered.<name>s it names."""
    names: set[str] = set()
    mentioned = False
    for node in ast.find_all(nodes.Name):
        if node.name == "registered":
            mentioned = True
    for getattr_node in ast.find_all(nodes.Getattr):
        if isinstance(getattr_node.node, nodes.Name) and getattr_node.node.name == "registered":
            names.add(getattr_node.attr)
    for getitem in ast.find_all(nodes.Getitem):
        if (isinstance(getitem.node, nodes.Name) and getitem.node.name == "registered"
                and isinstance(getitem.arg, nodes.Const) and isinstance(getitem.arg.value, str)):
            names.add(getitem.arg.value)
    return mentioned, names


# --- what render sees of the model, and what a step type sees of render ------------------------------
# The model builds its Step from the step types (steps/), and those render their own templates here: so
# this module names the model only through these protocols (the import graph stays a tree).

Loc = tuple[str | int, ...]


class StepFields(Protocol):
    """A step's own fields (model.Step), as the templates and the step types see them."""

    @property
    def name(self) -> str: ...
    @property
    def when(self) -> str | None: ...
    @property
    def check(self) -> str | None: ...
    @property
    def facts_check(self) -> str | None: ...
    @property
    def apply(self) -> str | None: ...
    @property
    def verify(self) -> str | None: ...
    @property
    def until(self) -> str | None: ...
    @property
    def changed_when(self) -> str | None: ...
    @property
    def retries(self) -> int: ...
    @property
    def delay(self) -> float: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def ignore_errors(self) -> bool: ...
    @property
    def register_as(self) -> str | None: ...
    @property
    def env(self) -> Mapping[str, str | int | float | bool]: ...
    @property
    def action(self) -> tuple[StepTemplates, Any] | None: ...  # the step's type and its spec, if typed


class StepTemplates(Protocol):
    """The template side of a step type (steps/base.StepType)."""

    @property
    def key(self) -> str: ...

    def compile(self, spec: Any, compiler: Compiler) -> Any: ...

    def render(self, spec: Any, compiled: Any, renderer: Renderer) -> Any: ...


class PlaybookSource(Protocol):
    """A playbook (model.Playbook), as its templates are compiled and rendered."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def vars(self) -> Mapping[str, Any]: ...
    @property
    def steps(self) -> Sequence[StepFields]: ...

    def error_at(self, loc: Loc, message: str, cls: type[ConfigError] = PlaybookError) -> ConfigError: ...


class Compiler(Protocol):
    """Load time, for one step: compiles a step type's templates; every loc is relative to the step and
    an error names file, line and field."""

    def text(self, source: str, loc: Loc) -> jinja2.Template:
        """Plain text, not quoted (a path, a key)."""
        ...

    def script(self, source: str, loc: Loc) -> jinja2.Template:
        """A shell script: every value shell-quoted; a `{{ }}` inside shell quotes is refused."""
        ...

    def expression(self, source: str, loc: Loc) -> Any:
        """A jinja2 expression, evaluated to a value by Renderer.evaluate."""
        ...

    def error(self, loc: Loc, message: str) -> ConfigError:
        """A load-time error about the step's field at loc."""
        ...


class Renderer(Protocol):
    """Per target, for one step: renders what a Compiler compiled. `field` is the dotted path of the
    template under the step (`copy.src`), named in errors; `extra` adds names to the scope (`item`)."""

    @property
    def exports(self) -> str: ...  # the step's env, exported: the top of each of its scripts
    @property
    def directory(self) -> Path: ...  # the playbook's directory: where its relative paths start

    def text(self, template: jinja2.Template, field: str, extra: Mapping[str, Any] | None = None) -> str: ...

    def evaluate(self, expression: Any, field: str, extra: Mapping[str, Any] | None = None) -> Any: ...

    def error(self, field: str, exc: BaseException) -> TemplateError:
        """A template error about the step's field (e.g. a path that rendered empty)."""
        ...


class _StepCompiler:
    def __init__(self, compiled: CompiledPlaybook, step: StepFields, at: Loc,
                 asts: list[tuple[Loc, nodes.Template]]) -> None:
        self.compiled, self.step, self.at, self.asts = compiled, step, at, asts

    def text(self, source: str, loc: Loc) -> jinja2.Template:
        ast, template = self.compiled._parse(TEXT_ENV, source, (*self.at, *loc))
        self.asts.append(((*self.at, *loc), ast))
        return template

    def script(self, source: str, loc: Loc) -> jinja2.Template:
        return self.compiled._compile_script(self.step, source, (*self.at, *loc), self.asts)

    def expression(self, source: str, loc: Loc) -> Any:
        try:
            self.asts.append(((*self.at, *loc), TEXT_ENV.parse("{{ " + source + " }}")))
            return TEXT_ENV.compile_expression(source, undefined_to_none=False)
        except jinja2.TemplateSyntaxError as exc:
            raise self.error(loc, f"expression syntax error: {exc.message}") from None

    def error(self, loc: Loc, message: str) -> ConfigError:
        return self.compiled.playbook.error_at((*self.at, *loc), message)


class _StepRenderer:
    def __init__(self, compiled: CompiledPlaybook, step: CompiledStep, scope: Mapping[str, Any],
                 exports: str) -> None:
        self.compiled, self.step, self.scope, self.exports = compiled, step, scope, exports

    @property
    def directory(self) -> Path:
        path = self.compiled.playbook.path
        return Path(path).parent if path != "<playbook>" else Path.cwd()

    def text(self, template: jinja2.Template, field: str, extra: Mapping[str, Any] | None = None) -> str:
        try:
            return template.render({**self.scope, **extra} if extra else self.scope)
        except _RENDER_ERRORS as exc:
            raise self.error(field, exc) from None

    def evaluate(self, expression: Any, field: str, extra: Mapping[str, Any] | None = None) -> Any:
        try:
            return expression(**({**self.scope, **extra} if extra else self.scope))
        except _RENDER_ERRORS as exc:
            raise self.error(field, exc) from None

    def error(self, field: str, exc: BaseException) -> TemplateError:
        return self.compiled._step_error(self.step, field, exc)


# --- compiled playbooks ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RenderedTransfer:
    """A copy/fetch step for one target: paths rendered, the mode parsed."""

    kind: str  # "copy" | "fetch"
    src: str
    dest: str
    mode: int | None
    max_bytes: int | None


@dataclass(frozen=True)
class RenderedItem:
    """One item of a wheels step: its key fields (without name/version) and its four scripts."""

    item: Any
    key: dict[str, str]
    describe: str
    build: str
    install: str
    verify: str
    upstream: str = ""  # upstream's release wheel URL template (wheels.release.PLACEHOLDERS); "": none
    source: str = ""  # the source archive's location on the controller (fleetfix.wheels.source); "": none
    source_sha256: str = ""  # the sha256 that archive must have; "": not pinned


@dataclass(frozen=True)
class RenderedStep:
    """A step's scripts, ready to send: env exports first, then the author's script."""

    check: str | None
    apply: str | None
    verify: str | None
    action: Any = None  # a typed step's own part, as its type rendered it (StepType.render)

    def script(self, phase: str) -> str | None:
        value: str | None = getattr(self, phase)
        return value


@dataclass
class CompiledStep:
    index: int
    step: StepFields
    scripts: dict[str, jinja2.Template]
    env: dict[str, jinja2.Template]
    expressions: dict[str, Any]  # field -> jinja2 TemplateExpression
    uses_registered: bool  # renders at run time, just before it runs
    action: Any = None  # a typed step's own templates, as its type compiled them (StepType.compile)
    facts_check: jinja2.Template | None = None  # plain text, rendered when the target is planned


class CompiledPlaybook:
    """Every template of one playbook, compiled and checked once, rendered per target."""

    def __init__(self, playbook: PlaybookSource) -> None:
        self.playbook = playbook
        self.var_templates = {name: self._compile_value(value, ("vars", name))
                              for name, value in playbook.vars.items()}
        self.steps: list[CompiledStep] = []
        registered_so_far: set[str] = set()
        for index, step in enumerate(playbook.steps):
            self.steps.append(self._compile_step(index, step, registered_so_far))
            if step.register_as:
                registered_so_far.add(step.register_as)

    # load time

    def _compile_value(self, value: Any, loc: tuple[str | int, ...]) -> Any:
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            return self._parse(TEXT_ENV, value, loc)[1]
        if isinstance(value, list):
            return [self._compile_value(item, (*loc, index)) for index, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self._compile_value(item, (*loc, key)) for key, item in value.items()}
        return value

    def _parse(self, env: SandboxedEnvironment, source: str, loc: tuple[str | int, ...],
               ) -> tuple[nodes.Template, jinja2.Template]:
        try:
            ast = env.parse(source)
            return ast, env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise self.playbook.error_at(
                loc, f"template syntax error (template line {exc.lineno}): {exc.message}") from None

    def _compile_step(self, index: int, step: StepFields, registered_before: set[str]) -> CompiledStep:
        at: Loc = ("steps", index)
        asts: list[tuple[Loc, nodes.Template]] = []
        scripts: dict[str, jinja2.Template] = {}
        for field in SCRIPT_FIELDS:
            source = getattr(step, field)
            if source is None:
                continue
            scripts[field] = self._compile_script(step, source, (*at, field), asts)
        action: Any = None
        if step.action is not None:
            kind, spec = step.action
            action = kind.compile(spec, _StepCompiler(self, step, at, asts))
        env: dict[str, jinja2.Template] = {}
        for name, value in step.env.items():
            ast, env[name] = self._parse(TEXT_ENV, str(value), (*at, "env", name))
            asts.append(((*at, "env", name), ast))
        facts_check: jinja2.Template | None = None
        if step.facts_check is not None:
            ast, facts_check = self._parse(TEXT_ENV, step.facts_check, (*at, "facts_check"))
            if _registered_refs(ast)[0]:
                raise self.playbook.error_at((*at, "facts_check"), f"step {step.name!r}: facts_check is "
                                             "rendered when the target is planned, before any registered")
            asts.append(((*at, "facts_check"), ast))
        expressions: dict[str, Any] = {}
        for field in EXPRESSION_FIELDS:
            source = getattr(step, field)
            if source is None:
                continue
            try:
                asts.append(((*at, field), TEXT_ENV.parse("{{ " + source + " }}")))
                expressions[field] = TEXT_ENV.compile_expression(source, undefined_to_none=False)
            except jinja2.TemplateSyntaxError as exc:
                raise self.playbook.error_at(
                    (*at, field), f"expression syntax error: {exc.message}") from None
        uses_registered = False
        for loc, ast in asts:
            mentioned, names = _registered_refs(ast)
            uses_registered = uses_registered or mentioned
            for name in sorted(names - registered_before):
                raise self.playbook.error_at(
                    loc, f"step {step.name!r}: registered.{name}: no earlier step has `register: {name}`")
            if "result" in meta.find_undeclared_variables(ast) and loc[-1] not in _RESULT_FIELDS:
                raise self.playbook.error_at(
                    loc, f"step {step.name!r}: `result` exists only in until and changed_when")
        return CompiledStep(index, step, scripts, env, expressions, uses_registered, action, facts_check)

    def _compile_script(self, step: StepFields, source: str, loc: Loc,
                        asts: list[tuple[Loc, nodes.Template]]) -> jinja2.Template:
        for line, expression, where in _quoting_problems(source):
            raise self.playbook.error_at(
                loc,
                f"step {step.name!r}: {{{{ {expression} }}}} (template line {line}) is inside "
                f"{where}; values are shell-quoted automatically, so write it outside any quotes, "
                f"or use `| raw` and quote it yourself")
        ast, template = self._parse(SCRIPT_ENV, source, loc)
        asts.append((loc, ast))
        return template

    # per target

    def resolve_vars(
        self, *, facts: Mapping[str, Any], target: Mapping[str, Any],
        target_vars: Mapping[str, Any], cli_vars: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Playbook defaults < inventory target vars < --var. Defaults are templates over facts, target
        and the vars above them; a default that is overridden is never rendered."""
        given = {**target_vars, **cli_vars}
        for name in given:
            if name in RESERVED_NAMES:
                raise TemplateError(f"var name {name!r} is reserved", path=self.playbook.path,
                                    field=f"vars.{name}")
        resolved: dict[str, Any] = {}
        for name, template in self.var_templates.items():
            if name in given:
                continue
            scope = self.scope(facts=facts, vars={**resolved, **given}, target=target, registered={})
            resolved[name] = self._render_value(template, scope, ("vars", name))
        return {**resolved, **given}

    def _render_value(self, value: Any, scope: Mapping[str, Any], loc: tuple[str | int, ...]) -> Any:
        if isinstance(value, jinja2.Template):
            try:
                return value.render(scope)
            except _RENDER_ERRORS as exc:
                raise self.playbook.error_at(loc, _message(exc), TemplateError) from None
        if isinstance(value, list):
            return [self._render_value(item, scope, (*loc, index)) for index, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self._render_value(item, scope, (*loc, key)) for key, item in value.items()}
        return value

    @staticmethod
    def scope(
        *, facts: Mapping[str, Any], vars: Mapping[str, Any], target: Mapping[str, Any],
        registered: Mapping[str, Any],
    ) -> dict[str, Any]:
        scope: dict[str, Any] = {name: scoped(value, name) for name, value in vars.items()}
        scope.update(facts=scoped(facts, "facts"), vars=scoped(vars, "vars"),
                     target=scoped(target, "target"), registered=scoped(registered, "registered"))
        return scope

    def known_from_facts(self, compiled: CompiledStep, scope: Mapping[str, Any]) -> str | None:
        """A step's facts_check rendered, whitespace trimmed: None when it has none or it renders empty."""
        if compiled.facts_check is None:
            return None
        try:
            return " ".join(compiled.facts_check.render(scope).split()) or None
        except _RENDER_ERRORS as exc:
            raise self._step_error(compiled, "facts_check", exc) from None

    def evaluate(self, compiled: CompiledStep, field: str, scope: Mapping[str, Any]) -> bool:
        """A step's when / until / changed_when, as a bool."""
        expression = compiled.expressions[field]
        try:
            return bool(expression(**scope))
        except _RENDER_ERRORS as exc:
            raise self._step_error(compiled, field, exc) from None

    def render(self, compiled: CompiledStep, scope: Mapping[str, Any]) -> RenderedStep:
        """The step's scripts for one target, with its env exported at the top of each."""
        exports: list[str] = []
        for name, template in compiled.env.items():
            try:
                exports.append(f"export {name}={shell_quote(template.render(scope))}\n")
            except _RENDER_ERRORS as exc:
                raise self._step_error(compiled, f"env.{name}", exc) from None
        rendered: dict[str, str | None] = {}
        for field in SCRIPT_FIELDS:
            script = compiled.scripts.get(field)
            if script is None:
                rendered[field] = None
                continue
            try:
                rendered[field] = "".join(exports) + script.render(scope)
            except _RENDER_ERRORS as exc:
                raise self._step_error(compiled, field, exc) from None
        action: Any = None
        if compiled.step.action is not None:
            kind, spec = compiled.step.action
            renderer = _StepRenderer(self, compiled, scope, "".join(exports))
            action = kind.render(spec, compiled.action, renderer)
        return RenderedStep(rendered["check"], rendered["apply"], rendered["verify"], action)

    def _step_error(self, compiled: CompiledStep, field: str, exc: BaseException) -> TemplateError:
        loc: Loc = ("steps", compiled.index, *field.split("."))
        error = self.playbook.error_at(loc, f"step {compiled.step.name!r}: {_message(exc)}", TemplateError)
        assert isinstance(error, TemplateError)
        return error


def _message(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split()) or type(exc).__name__


class _Cached(PlaybookSource, Protocol):
    _compiled: Any


def compile_playbook(playbook: _Cached) -> CompiledPlaybook:
    """Compile (once; cached on the playbook) and check every template. Raises PlaybookError."""
    if playbook._compiled is None:
        playbook._compiled = CompiledPlaybook(playbook)
    compiled: CompiledPlaybook = playbook._compiled
    return compiled


def render_script(source: str, scope: Mapping[str, Any]) -> str:
    """Render one script template outside a playbook (tests, ad-hoc use), with the same quoting rules."""
    problems = _quoting_problems(source)
    if problems:
        line, expression, where = problems[0]
        raise PlaybookError(f"{{{{ {expression} }}}} (line {line}) is inside {where}")
    try:
        return SCRIPT_ENV.from_string(source).render(scope)
    except _RENDER_ERRORS as exc:
        raise TemplateError(_message(exc)) from None


__all__: Sequence[str] = ["CompiledPlaybook", "Raw", "RenderedItem", "RenderedStep", "RenderedTransfer",
                          "compile_playbook", "render_script", "scoped", "shell_quote"]
