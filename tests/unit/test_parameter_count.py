"""No function in the package takes more than MAX_PARAMETERS parameters besides `self`/`cls`.

A long parameter list is usually settings threaded through every level; the cure is an object that carries
them (the playbook runner's RunContext, the CLI's option groups). Counted from the source (AST), for every
def, lambda and method: positional-only, positional and keyword-only parameters, and `*args` and `**kwargs`
one each (a catch-all still widens what a caller may pass). A method's leading `self`/`cls` is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fleetfix"
MAX_PARAMETERS = 6


def parameters(args: ast.arguments) -> int:
    names = [arg.arg for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


class _Counter(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: dict[str, int] = {}

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        count = parameters(node.args)
        in_class = bool(self.scope) and self.scope[-1] != "<locals>"
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        first = [*node.args.posonlyargs, *node.args.args][:1]
        if in_class and not static and first and first[0].arg in ("self", "cls"):
            count -= 1
        self.found[".".join([*self.scope, node.name])] = count
        self.scope += [node.name, "<locals>"]
        self.generic_visit(node)
        del self.scope[-2:]

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.found[".".join([*self.scope, f"<lambda>:{node.lineno}"])] = parameters(node.args)
        self.generic_visit(node)


def counts(tree: ast.AST) -> dict[str, int]:
    """Parameters of every function under tree, by qualified name; methods without their self/cls."""
    counter = _Counter()
    counter.visit(tree)
    return counter.found


def over_the_limit() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for name, count in counts(ast.parse(path.read_text())).items():
            if count > MAX_PARAMETERS:
                found[f"{where}:{name}"] = count
    return found


def test_no_function_takes_more_than_six_parameters() -> None:
    assert over_the_limit() == {}


def test_the_count() -> None:
    source = """
def seven(a, b, /, c, *args, d, e, **kwargs): pass
class K:
    def method(self, a, b, c, d, e, f): pass
    @classmethod
    def build(cls, a, b, c, d, e, f, g): pass
    @staticmethod
    def static(self, a, b, c, d, e, f): pass
def outer():
    def inner(a, b, c, d, e, f, g): pass
    return lambda a, b, c, d, e, f, g: None
"""
    assert counts(ast.parse(source)) == {
        "seven": 7, "K.method": 6, "K.build": 7, "K.static": 7, "outer": 0,
        "outer.<locals>.inner": 7, "outer.<locals>.<lambda>:11": 7,
    }
