"""YAML loading that remembers where every value came from, so errors can name file:line and field.

`load_yaml(path)` returns the data and a `Locations` index keyed by the same paths pydantic uses in
`ValidationError.loc` (mapping keys and list indexes), so a validation error becomes one line:
`inventory.yaml:14: nodes.0.containers.1.ctid: Input should be a valid integer`.

Bounded: a file is at most MAX_YAML_BYTES; its values nest at most MAX_DEPTH deep; aliases may add at most
MAX_ALIAS_VALUES values to the document as written (PyYAML shares an alias's node instead of copying it,
yaml/pyyaml#235, so the load itself is cheap, but everything that walks the result, our line index and
pydantic included, visits every expansion: a 1 kB "billion laughs" document took 1.5 GB); an integer has at
most MAX_INT_DIGITS digits (Python refuses to convert more than 4300 with a ValueError, and anything beyond
64 bits is no count, port or id). Each limit is a one-line ConfigError, exit 2.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fleetfix.errors import ConfigError, one_line

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_ALIAS_VALUES = 10_000
MAX_INT_DIGITS = 20
_INT_TAG = "tag:yaml.org,2002:int"

# libyaml's parser (PyYAML's C extension, in its wheels) where it is there: the same nodes, tags and line
# marks as the pure-Python parser, several times faster to compose a large inventory
# (docs/performance.md). Its composer recurses in C, without Python's recursion limit, and libyaml before
# 2024 has no nesting limit of its own: `_check_nesting` walks its event stream (no recursion) first.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # CSafeLoader: not a SafeLoader subclass
_NEST = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_UNNEST = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class Locations:
    """Line numbers (1-based) of every mapping key and list item in one YAML document."""

    def __init__(self, path: str, lines: dict[Loc, int]) -> None:
        self.path = path
        self._lines = lines

    def line(self, loc: Loc) -> int | None:
        """The line of loc, or of its nearest ancestor that has one."""
        for end in range(len(loc), -1, -1):
            found = self._lines.get(tuple(loc[:end]))
            if found is not None:
                return found
        return None

    def error(self, loc: Loc, message: str, cls: type[ConfigError] = ConfigError) -> ConfigError:
        field = ".".join(str(part) for part in loc) or None
        return cls(message, path=self.path, line=self.line(loc), field=field)


def _walk(
    node: yaml.Node, loc: Loc, lines: dict[Loc, int], path: str, cls: type[ConfigError]
) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise cls(
                    f"duplicate key {key!r}", path=path, line=key_node.start_mark.line + 1,
                    field=".".join(str(p) for p in (*loc, key)),
                )
            seen.add(key)
            lines[(*loc, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*loc, key), lines, path, cls)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*loc, index), lines, path, cls)


def check_budget(root: yaml.Node, path: str, cls: type[ConfigError] = ConfigError) -> None:
    """Refuse a composed document that nests too deeply, expands too much through aliases, refers to
    itself, or holds an integer too long to be one. Iterative, and each node is sized once: the check
    itself costs what the document as written costs, never what it expands to."""
    expanded: dict[int, int] = {}  # node id -> values it expands to (itself included)
    depth: dict[int, int] = {}  # node id -> levels below and including it
    literal = 0  # distinct nodes: the document as written
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            expanded[key] = 1 + sum(expanded[id(child)] for child in children)
            depth[key] = 1 + max((depth[id(child)] for child in children), default=0)
            in_progress.discard(key)
            if depth[key] > MAX_DEPTH:  # through aliases: as written, `_check_nesting` refused it
                raise _too_deep(path, node.start_mark, cls)
            if expanded[key] - literal > MAX_ALIAS_VALUES:
                raise cls(f"invalid YAML: aliases expand it by more than {MAX_ALIAS_VALUES} values (a "
                          "'billion laughs' document?); write the values out or use fewer aliases",
                          path=path, line=node.start_mark.line + 1)
            continue
        if key in expanded:
            continue
        if key in in_progress:
            raise cls("invalid YAML: an alias refers to a node that contains it", path=path,
                      line=node.start_mark.line + 1)
        literal += 1
        if isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG:
            digits = len(node.value.lstrip("+-").replace("_", ""))  # hex and octal count their letters
            if digits > MAX_INT_DIGITS:
                raise cls(f"an integer of {digits} digits: at most {MAX_INT_DIGITS} are accepted",
                          path=path, line=node.start_mark.line + 1)
        in_progress.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_nesting(text: str, path: str, cls: type[ConfigError]) -> None:
    """Refuse text nested more than MAX_DEPTH levels as written, before anything recurses into it."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, _NEST):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(path, event.start_mark, cls)
            elif isinstance(event, _UNNEST):
                depth -= 1
    except yaml.MarkedYAMLError as error:
        if error.problem == "exceeded maximum nesting depth":  # libyaml's own limit (1000), met first
            raise _too_deep(path, error.problem_mark, cls) from None
        raise


def _too_deep(path: str, mark: Any, cls: type[ConfigError]) -> ConfigError:
    """The error for nesting past MAX_DEPTH at mark (a Mark of either parser, or None)."""
    line = None if mark is None else mark.line + 1
    return cls(f"invalid YAML: nested more than {MAX_DEPTH} levels deep", path=path, line=line)


def _construct(node: yaml.Node | None) -> Any:
    """The Python data of a composed (and checked) document: PyYAML's safe constructor, run once."""
    if node is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_yaml(text: str, path: str, cls: type[ConfigError] = ConfigError) -> tuple[Any, Locations]:
    """Parse one YAML document from text; syntax errors and documents over budget become one-line
    ConfigErrors."""
    if len(text) > MAX_YAML_BYTES:
        raise cls(f"file is over {MAX_YAML_BYTES // (1024 * 1024)} MiB: not a fleetfix file?", path=path)
    try:
        _check_nesting(text, path, cls)
        node = yaml.compose(text, Loader=_LOADER)
        if node is not None:
            check_budget(node, path, cls)
        data = _construct(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise cls(f"invalid YAML: {one_line(exc.problem or str(exc))}", path=path, line=line) from None
    except yaml.YAMLError as exc:
        raise cls(f"invalid YAML: {one_line(str(exc))}", path=path) from None
    except RecursionError:
        raise cls("invalid YAML: nested too deeply", path=path) from None
    except ValueError as exc:  # a constructor's own refusal (a malformed timestamp, say)
        raise cls(f"invalid YAML: {one_line(str(exc))}", path=path) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        try:
            _walk(node, (), lines, path, cls)
        except RecursionError:
            raise cls("invalid YAML: nested too deeply", path=path) from None
    return data, Locations(path, lines)


def load_yaml(path: str | Path, cls: type[ConfigError] = ConfigError) -> tuple[Any, Locations]:
    try:
        with open(path, "rb") as handle:  # never more than the budget into memory
            raw = handle.read(MAX_YAML_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise cls("file not found", path=str(path)) from None
    except IsADirectoryError:
        raise cls("is a directory, not a file", path=str(path)) from None
    except UnicodeDecodeError:
        raise cls("cannot read: not UTF-8 text", path=str(path)) from None
    except OSError as exc:
        raise cls(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    return parse_yaml(text, str(path), cls)


def validate(model: type[M], data: Any, where: Locations, cls: type[ConfigError] = ConfigError) -> M:
    """model.model_validate(data), with one error turned into a one-line ConfigError.

    An unknown key is reported before any other error, with the closest known field: a misspelt key
    (`adress:`) also leaves its real field missing, and "address: Field required" would send the reader
    looking for a key that is, to their eyes, right there."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(part for part in first["loc"] if not str(part).startswith("function-"))
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unknown field" + _suggestion(model, loc)
        raise where.error(loc, message, cls) from None


def _suggestion(model: type[BaseModel], loc: Loc) -> str:
    """` (did you mean 'address'?)` for the unknown key at loc, else the fields it could have been."""
    parent = _model_at(model, loc[:-1])
    if parent is None or not loc or not isinstance(loc[-1], str):
        return ""
    known = [info.alias or name for name, info in parent.model_fields.items() if not info.exclude]
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (expected one of: {', '.join(known)})" if known else ""


def _model_at(annotation: Any, loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that validates the value at loc under annotation, if one does."""
    for part in loc:
        annotation = _child(annotation, part)
        if annotation is None:
            return None
    model = _unwrap(annotation)
    if typing.get_origin(model) in (typing.Union, types.UnionType):  # an optional section: Model | None
        model = next((arm for arm in typing.get_args(model)
                      if isinstance(arm, type) and issubclass(arm, BaseModel)), None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _child(annotation: Any, part: str | int) -> Any:
    """The annotation of the item `part` of a value of type annotation (a field, list item, dict value)."""
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):  # X | None: the first arm that has such an item
        for arm in typing.get_args(annotation):
            found = _child(arm, part)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(part, str):
            return None
        for name, info in annotation.model_fields.items():
            if part in (name, info.alias):
                return info.annotation
        return None
    args = typing.get_args(annotation)
    if origin in (list, tuple) and isinstance(part, int) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None
