"""The docs cannot rot: every `$ fleetfix ...` command in a console block of README.md and docs/*.md is run
against a fresh lab (the same one `scripts/lab.sh up` starts), in order, one lab per document, and its key
lines are compared.

The convention, inside ```console blocks only (a console block is runnable against the lab as written):

    $ fleetfix probe -i $LAB_INVENTORY --limit train-a        # exit 3
    == train-a error (0.89s)
       ERROR   CUDA_RUNTIME_WITHOUT_TOOLKIT: torch ... # checked

* A line starting with `$ ` is a command; a trailing `\\` continues it on the next line. Only commands whose
  first word is `fleetfix` are run (set-up commands such as `scripts/lab.sh up` are not).
* `# exit N` at the end of a command line (a comment to the shell) is the exit status it must return;
  without it the command must exit 0.
* An output line ending in `# checked` must appear, exactly (trailing blanks aside), among the lines the
  command printed (stdout and stderr together). Unmarked lines are real output too, but vary from run to
  run (timings, run ids, ports) and are not compared.
* A console block right after the line `<!-- opt-in: VAR -->` runs only when the environment has VAR=1
  (the full causal-conv1d build: ~1.5 h on 2 cores); its output was pasted from such a run.
* Every other block that runs fleetfix is a template for a real fleet and says so on the line before it:
  `<!-- template: why -->` (tests/unit/test_readme.py holds every document to that).
* The tutorial runs against a lab started with `--real-torch` (its train-cu130 container compiles a real
  CUDA extension), the other docs against the plain lab.
* `$LAB_INVENTORY` and `$REPO_BASE` stand for the lab's inventory path and cuda_repo_base, in commands
  (where the shell expands them) and in checked lines (where this test does).

Commands run through bash, from the repository root, exactly as written, with `fleetfix` meaning this
checkout (`python -m fleetfix`) and a private state directory. NO_COLOR is not set: output to a pipe must
be plain text on its own, so the test also fails on any escape character.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.lab.cli import RunningLab, build_lab, prerequisite_problems

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = "docs/tutorial-missing-toolkit.md"
DOCS = ("README.md", *sorted(f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")))
CHECKED_MARK = "# checked"
EXIT_COMMENT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
OPT_IN = re.compile(r"^<!--\s*opt-in:\s*([A-Z0-9_]+)\s*-->\s*$")
TEMPLATE = re.compile(r"^<!--\s*template:\s*\S.*-->\s*$")


@dataclass
class DocCommand:
    doc: str
    line: int  # 1-based line of the `$ ` in the doc
    command: str  # as the shell gets it (continuations joined, `# exit N` kept: it is a comment)
    exit_code: int
    checked: list[str] = field(default_factory=list)
    opt_in: str | None = None  # the environment variable that must be 1 for it to run

    @property
    def is_fleetfix(self) -> bool:
        return self.command.split(maxsplit=1)[:1] == ["fleetfix"]


def console_commands(doc: str, text: str) -> list[DocCommand]:
    """Every `$ ` command of the ```console blocks of text, with its expected exit code and checked lines."""
    commands: list[DocCommand] = []
    in_console = False
    current: DocCommand | None = None
    continuing = False
    opt_in: str | None = None  # of the block being read
    previous = ""
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            in_console = not in_console and fence.group(1) == "console"
            found_opt_in = OPT_IN.match(previous)
            opt_in = found_opt_in.group(1) if in_console and found_opt_in else None
            current, continuing = None, False
            previous = line
            continue
        previous = line
        if not in_console:
            continue
        if continuing and current is not None:
            current.command += "\n" + line
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            current = DocCommand(doc, number, line[2:], 0, opt_in=opt_in)
            commands.append(current)
            continuing = line.endswith("\\")
        elif current is not None and line.rstrip().endswith(CHECKED_MARK):
            current.checked.append(line.rstrip()[: -len(CHECKED_MARK)].rstrip())
        if current is not None and not continuing:
            found = EXIT_COMMENT.search(current.command)
            current.exit_code = int(found.group(1)) if found else 0
    return commands


def doc_commands(doc: str) -> list[DocCommand]:
    return [c for c in console_commands(doc, (REPO / doc).read_text()) if c.is_fleetfix]


# Every document with a runnable fleetfix command: each is run against its own fresh lab.
CHECKED_DOCS = tuple(doc for doc in DOCS if doc_commands(doc))


@contextlib.contextmanager
def docs_lab(tmp_path: Path, *, real_torch: bool) -> Iterator[RunningLab]:
    problems = prerequisite_problems(healthy=True, real_torch=real_torch)
    if problems:
        pytest.skip("the lab cannot start here: " + "; ".join(problems))
    running = build_lab(tmp_path / "lab", healthy=True, real_torch=real_torch)
    try:
        yield running
    finally:
        running.close()


def _shell_env(tmp_path: Path, running: RunningLab) -> dict[str, str]:
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "fleetfix"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m fleetfix "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "FLEETFIX_INVENTORY")}
    env.update(
        PATH=f"{shim_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        LAB_INVENTORY=str(running.inventory),
        REPO_BASE=running.repo.base_url,
        FLEETFIX_STATE_DIR=str(tmp_path / "state"),
        FLEETFIX_AUDIT_DB=str(tmp_path / "state" / "audit.db"),
    )
    return env


def _opted_in(command: DocCommand) -> bool:
    return command.opt_in is None or os.environ.get(command.opt_in) == "1"


# A fresh lab (the tutorial's with the real torch: a first run builds its caches) plus a dozen CLI runs,
# one of them a real CUDA compile: minutes on a loaded 2-core machine; hours with the opt-in build.
FULL_BUILD_OPTED_IN = os.environ.get("FLEETFIX_CAUSAL_CONV1D_FULL") == "1"


@pytest.mark.slow
@pytest.mark.timeout(5 * 3600 if FULL_BUILD_OPTED_IN else 2400)
@pytest.mark.parametrize("doc", CHECKED_DOCS)
def test_doc_commands_print_what_the_doc_shows(doc: str, tmp_path: Path) -> None:
    commands = doc_commands(doc)
    assert commands, f"{doc} has no `$ fleetfix` command in a console block"
    with docs_lab(tmp_path, real_torch=doc == TUTORIAL) as lab:
        _run_doc_commands(doc, [c for c in commands if _opted_in(c)], lab, tmp_path)


def _run_doc_commands(doc: str, commands: list[DocCommand], docs_lab: RunningLab, tmp_path: Path) -> None:
    env = _shell_env(tmp_path, docs_lab)
    substitutions = {"$LAB_INVENTORY": str(docs_lab.inventory), "$REPO_BASE": docs_lab.repo.base_url}
    for command in commands:
        where = f"{doc}:{command.line}: $ {command.command}"
        done = subprocess.run(
            ["bash", "-c", command.command], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=4 * 3600 if command.opt_in else 900,
        )
        output = done.stdout
        assert done.returncode == command.exit_code, f"{where}\nexit {done.returncode}, output:\n{output}"
        assert "\x1b" not in output, f"{where}\nescape sequences in output to a pipe:\n{output!r}"
        printed = {line.rstrip() for line in output.splitlines()}
        for expected in command.checked:
            for placeholder, value in substitutions.items():
                expected = expected.replace(placeholder, value)
            assert expected in printed, f"{where}\nmissing line:\n{expected}\nin output:\n{output}"
