"""What fleetfix's source must not carry: comments that are a diary, constants or helpers defined twice.

Comments and docstrings say why the code is as it is. The history of how it got there (which issue asked
for it, what it measured before and after) belongs in the commit log and docs/performance.md, where it can
be dated and compared; in the code it goes stale unseen. So no comment or docstring under fleetfix/ (Python
comments and docstrings, the shell and Perl scripts' `#` comments, the templates' `{# #}`) may:

- name one of this project's issues: "issue 21", "issue #8", "(issue-21b)", or a bare "#21". A source cited
  as evidence names its repository, `NVIDIA/cuda-repo-management#39`, and stays: it is a reason;
- quote a timing as a measurement: a duration (ms, µs, s, seconds, min) that is approximate ("~0.12 s",
  "about 3 s") or sits on a line with a measurement word: measured, took, cost(s), spent, spends, saved,
  faster, slower, "of CPU", "of wall", "instead of", "against", "->" or "→" (before and after). A duration
  that is a reason stays: a constant's value and whose it is ("qm's own wait, 30 s"), a limit another
  program sets ("no answer to guest-ping within 3 s"), an example of a format ("'5 min'").
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleetfix"


ISSUE = re.compile(r"\bissues?[\s-]*#?\d+|(?<![\w/.-])#\d+\b", re.IGNORECASE)
DURATION = re.compile(r"(?P<approx>~|\babout |\baround |\broughly |\bnearly )?"
                      r"(?<![\w.])\d+(?:[.,]\d+)?(?:[-\u2013]\d+(?:\.\d+)?)?\s?"
                      r"(?:ms|µs|us|ns|s|secs?|seconds?|min|minutes?)\b")
MEASURED = re.compile(r"\bmeasured\b|\btook\b|\bcosts?\b|\bspent\b|\bspends\b|\bsaved\b|\bfaster\b|"
                      r"\bslower\b|\bof CPU\b|\bof wall\b|\binstead of\b|\bagainst\b|->|→", re.IGNORECASE)


def python_texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every line of every docstring."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line


def script_texts(source: str) -> Iterator[tuple[int, str]]:
    """Shell and Perl `#` comments: whole-line ones and those after code (`code  # why`)."""
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.lstrip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            yield number, stripped
        elif " # " in line:
            yield number, line.split(" # ", 1)[1]


def template_texts(source: str) -> Iterator[tuple[int, str]]:
    for match in re.finditer(r"\{#.*?#\}", source, re.DOTALL):
        first = source.count("\n", 0, match.start()) + 1
        for offset, line in enumerate(match.group().splitlines()):
            yield first + offset, line


def texts(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_texts(source)
    if path.suffix in (".sh", ".pl"):
        return script_texts(source)
    return template_texts(source)


def sources() -> list[tuple[str, Path]]:
    found = [p for suffix in ("*.py", "*.sh", "*.pl", "*.j2") for p in PACKAGE.rglob(suffix)]
    return sorted((p.relative_to(ROOT).as_posix(), p) for p in found if "__pycache__" not in p.parts)


def diary_lines(text: str) -> list[str]:
    """What in one line of a comment breaks the rules above."""
    problems = [f"names an issue ({m.group()!r})" for m in ISSUE.finditer(text)]
    for match in DURATION.finditer(text):
        if match.group("approx") or MEASURED.search(text):
            problems.append(f"quotes a timing ({match.group().strip()!r})")
    return problems


def test_the_rules_tell_a_diary_from_a_reason() -> None:
    diary = ["(issue 21)", "issue #8 asked for it", "the branch issue-21b", "see #21",
             "~0.12 s to import", "about 3 s of its 4", "measured: 9.3 ms per container",
             "the first handshake started 0.24 s after the dial instead of 0.08 s",
             "0.7 s against 2.2 s", "177 -> 160 ms of CPU", "it cost 1.8 ms per channel"]
    reasons = ["(NVIDIA/cuda-repo-management#39)", "Dao-AILab/causal-conv1d#106 skips that gencode",
               "PKCS#8's ENCRYPTED header", "qm's own wait is always given: its default (30 s)",
               "no answer to guest-ping within 3 s", "A duration as a person says it: '5 min', '3 h'",
               "a systemd time span (\"15min\", \"1h 30min\")", "the agent, up to 3 s, before it starts",
               "sizes: 4 MiB pieces, at most 128 KiB"]
    assert [text for text in diary if not diary_lines(text)] == []
    assert [text for text in reasons if diary_lines(text)] == []


def test_no_comment_names_an_issue_or_quotes_a_timing() -> None:
    found = [f"{name}:{line}: {problem}: {text.strip()}"
             for name, path in sources()
             for line, text in texts(path) for problem in diary_lines(text)]
    assert found == [], "\n".join(["comments say why; history goes to docs/performance.md:", *found])


def test_shared_constants_and_helpers_are_defined_once() -> None:
    """TIMEOUT_EXIT_CODE (transport/base.py) and one_line (errors.py): one definition each."""
    definitions: dict[str, list[str]] = {"TIMEOUT_EXIT_CODE": [], "one_line": []}
    for name, path in sources():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.FunctionDef):
                defined = [node.name.lstrip("_")]
            else:
                continue
            for one in defined:
                if one in definitions:
                    definitions[one].append(f"{name}:{node.lineno}")
    where = {name: [found.split(":")[0] for found in places] for name, places in definitions.items()}
    expected = {"TIMEOUT_EXIT_CODE": ["fleetfix/transport/base.py"], "one_line": ["fleetfix/errors.py"]}
    assert where == expected, definitions
