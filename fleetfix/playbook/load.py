"""Reading a playbook: YAML -> validated model (model.py) -> every template compiled and checked (render.py),
so a bad playbook fails with one line naming file, line and field before any target is contacted."""

from __future__ import annotations

from pathlib import Path

from fleetfix.errors import PlaybookError
from fleetfix.playbook.model import Playbook, check_rules
from fleetfix.playbook.render import compile_playbook
from fleetfix.yamlsource import Loc, parse_yaml, validate


def parse_playbook(text: str, path: str = "<playbook>", *, _stack: tuple[str, ...] = ()) -> Playbook:
    """Validate and compile a playbook from YAML text. Raises PlaybookError (one line) on any problem."""
    data, where = parse_yaml(text, path, PlaybookError)
    if not isinstance(data, dict):
        raise PlaybookError("a playbook is a mapping (name, vars, steps, ...)", path=path, line=1)
    book = validate(Playbook, data, where, PlaybookError)
    book._path, book._locations = path, where
    check_rules(book)
    for index, required in enumerate(book.requires):
        base = Path(path).parent if path != "<playbook>" else Path.cwd()
        required_path = str(base / required)
        resolved = str(Path(required_path).resolve())
        if resolved in _stack or resolved == str(Path(path).resolve()):
            raise book.error_at(("requires", index), f"circular requirement: {required}")
        book._required.append(
            _load(required_path, (*_stack, str(Path(path).resolve())), book, ("requires", index)))
    compile_playbook(book)
    return book


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlaybookError("file not found", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaybookError(f"cannot read: {exc}", path=str(path)) from None


def _load(path: str, stack: tuple[str, ...], parent: Playbook, loc: Loc) -> Playbook:
    if not Path(path).is_file():
        raise parent.error_at(loc, f"required playbook not found: {path}")
    return parse_playbook(_read(path), path, _stack=stack)


def load_playbook(path: str | Path) -> Playbook:
    """Load, validate and compile a playbook file (and the playbooks it requires)."""
    return parse_playbook(_read(path), str(path))
