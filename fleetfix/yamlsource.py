"""YAML loading that remembers where every value came from, so errors can name file:line and field.

`load_yaml(path)` returns the data and a `Locations` index keyed by the same paths pydantic uses in
`ValidationError.loc` (mapping keys and list indexes), so a validation error becomes one line:
`inventory.yaml:14: nodes.0.containers.1.ctid: Input should be a valid integer`.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fleetfix.errors import ConfigError

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


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


def parse_yaml(text: str, path: str, cls: type[ConfigError] = ConfigError) -> tuple[Any, Locations]:
    """Parse one YAML document from text; syntax errors become one-line ConfigErrors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise cls(f"invalid YAML: {_one_line(exc.problem or str(exc))}", path=path, line=line) from None
    except yaml.YAMLError as exc:
        raise cls(f"invalid YAML: {_one_line(str(exc))}", path=path) from None
    except RecursionError:
        raise cls("invalid YAML: nested too deeply", path=path) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        try:
            _walk(node, (), lines, path, cls)
        except RecursionError:
            raise cls("invalid YAML: nested too deeply", path=path) from None
    return data, Locations(path, lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def load_yaml(path: str | Path, cls: type[ConfigError] = ConfigError) -> tuple[Any, Locations]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise cls("file not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise cls(f"cannot read: {exc}", path=str(path)) from None
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
