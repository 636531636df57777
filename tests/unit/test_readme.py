"""The README and docs/ stay navigable and truthful: links resolve, every doc is reachable from the README,
the README's test command is the one CI runs, and the checked docs really contain checked commands."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.e2e.test_docs_tutorial import CHECKED_DOCS, OPT_IN, TEMPLATE, console_commands
from tests.e2e.test_docs_tutorial import DOCS as DOC_NAMES
from tests.e2e.test_docs_tutorial import FENCE as CODE_FENCE

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
# [text](target) outside code; images too. Reference-style links are not used in this project.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """text without fenced code blocks and inline code, where [x](y) is not a link."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            in_code = not in_code
            continue
        if not in_code:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def relative_links(path: Path) -> list[str]:
    links = LINK.findall(prose(path.read_text()))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in prose(path.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for link in relative_links(path):
        target, _, anchor = unquote(link).partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            broken.append(f"{link} (no such file: {resolved.relative_to(REPO)})")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{link} (no heading #{anchor} in {resolved.relative_to(REPO)})")
    assert not broken, f"{path.relative_to(REPO)}: broken links: {broken}"


def test_the_link_check_sees_links_and_would_catch_a_broken_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](missing.md) and [b](https://example.org) and `[c](x.md)`.\n```\n[d](y.md)\n```\n"
    )
    assert relative_links(page) == ["missing.md"]


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(README.parent / unquote(link).partition("#")[0]).resolve() for link in relative_links(README)}
    unlinked = [str(doc.relative_to(REPO)) for doc in DOCS if doc.resolve() not in linked]
    assert not unlinked, f"docs not linked from README.md: {unlinked}"


def ci_test_command() -> str:
    """The command .ci/run runs after its `# The README's test command:` comment."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if line.strip() == "# The README's test command:")
    return lines[marker + 1].strip()


def test_readme_test_command_is_the_one_ci_runs() -> None:
    command = ci_test_command()
    assert shlex.split(command)[:3] == ["python3", "-m", "pytest"], command
    readme = README.read_text()
    code_lines = {line.split("#")[0].strip() for line in readme.splitlines()}
    assert command in code_lines, f"README.md does not show .ci/run's test command {command!r}"
    assert "bash .ci/run" in readme


def test_readme_setup_installs_from_the_lock_and_runs_the_main_job() -> None:
    assert "scripts/install.sh && .venv/bin/fleetfix probe --local" in README.read_text()


def test_ci_installs_from_the_lock_into_a_fresh_venv_and_tests_there() -> None:
    lines = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    install = next(i for i, line in enumerate(lines) if line.startswith("scripts/install.sh"))
    assert {"--dev", "--fresh"} <= set(shlex.split(lines[install])), lines[install]
    activate = lines.index(". .ci/venv/bin/activate")
    assert install < activate < lines.index(ci_test_command()), "the tests must run in the fresh venv"
    assert not any("pip install" in line for line in lines), "every install goes through the lock"


def test_the_docs_test_runs_the_walkthroughs() -> None:
    """The docs test must not pass by finding nothing to run."""
    assert {"README.md", "docs/quickstart.md", "docs/tutorial-missing-toolkit.md", "docs/inventory.md",
            "docs/audit.md"} <= set(CHECKED_DOCS)


@pytest.mark.parametrize("doc", CHECKED_DOCS)
def test_checked_docs_have_checked_fleetfix_commands(doc: str) -> None:
    """Each runnable document compares output, not only exit codes."""
    commands = [c for c in console_commands(doc, (REPO / doc).read_text()) if c.is_fleetfix]
    assert commands and sum(len(c.checked) for c in commands) >= len(commands) // 2 + 1, doc


# A command line of a fenced block: `fleetfix ...` or `$ fleetfix ...`, not prose that names the tool.
RUNS_FLEETFIX = re.compile(r"^\s*(?:\$\s+)?fleetfix\s")
NOT_COMMANDS = {"text", "yaml", "json", "python", "toml", "ini", "xml", "html"}  # output and file formats


def untested_command_blocks(doc: str, text: str) -> list[str]:
    """Fenced blocks that run fleetfix but are neither run by the docs test (console) nor marked as a
    template (`<!-- template: why -->` on the line before): an example nobody checks against the lab."""
    found, lines, start = [], text.splitlines(), None
    for number, line in enumerate(lines):
        fence = CODE_FENCE.match(line)
        if fence and start is None:
            start, language = number, fence.group(1)
            continue
        if fence and start is not None:
            previous = lines[start - 1] if start else ""
            body = lines[start + 1:number]
            runs = any(RUNS_FLEETFIX.match(body_line) for body_line in body)
            marked = TEMPLATE.match(previous) or (language == "console" and not OPT_IN.match(previous))
            if runs and language not in NOT_COMMANDS and not (marked or OPT_IN.match(previous)):
                found.append(f"{doc}:{start + 1}")
            if runs and language == "console" and TEMPLATE.match(previous):
                found.append(f"{doc}:{start + 1} (a console block runs: drop the template mark)")
            start = None
    return found


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_every_fleetfix_example_runs_against_the_lab_or_is_marked_a_template(doc: str) -> None:
    assert not untested_command_blocks(doc, (REPO / doc).read_text())


# `fleetfix ... -i X`, `--inventory X`, `--host X` in running text: X must be a placeholder in capitals
# (`FILE`, `ADDR`), `$LAB_INVENTORY` or elided (`…`); a concrete name reads as something to paste.
INLINE_COMMAND = re.compile(r"`(fleetfix [^`]*)`")
INLINE_TARGET = re.compile(r"(?:^|\s)(?:-i|--inventory|--host)[\s=](\S+)")


@pytest.mark.parametrize("doc", [doc for doc in DOC_NAMES if doc != "docs/cli.md"])
def test_inline_commands_name_no_inventory_or_host_that_is_not_a_placeholder(doc: str) -> None:
    concrete = []
    for command in INLINE_COMMAND.findall(outside_fences((REPO / doc).read_text())):
        for value in INLINE_TARGET.findall(command):
            if not (value.isupper() or value in ("$LAB_INVENTORY", "…", "...")):
                concrete.append(command)
    assert not concrete, f"{doc}: {concrete}"


def outside_fences(text: str) -> str:
    """text without its fenced blocks (inline code kept)."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            in_code = not in_code
        elif not in_code:
            kept.append(line)
    return "\n".join(kept)


def test_the_example_checks_see_what_they_look_for() -> None:
    text = "\n".join([
        "```sh", "fleetfix probe -i inventory.yaml", "```",
        "<!-- template: a real fleet -->", "```", "fleetfix probe -i inventory.yaml", "```",
        "```console", "$ fleetfix probe -i $LAB_INVENTORY", "```",
        "```text", "fleetfix CLI (click)", "```",
        "<!-- template: x -->", "```console", "$ fleetfix probe", "```",
    ])
    assert untested_command_blocks("doc.md", text) == ["doc.md:1", "doc.md:15 (a console block runs: drop "
                                                       "the template mark)"]
    assert INLINE_TARGET.findall("fleetfix exec -i inventory.yaml --limit x") == ["inventory.yaml"]
    old_readme = "Run it with `fleetfix exec -i inventory.yaml --limit 'tag:gpu' -- cat /etc/os-release`.\n"
    assert INLINE_COMMAND.findall(outside_fences(old_readme + "```\n`fleetfix probe --host h`\n```\n")) == [
        "fleetfix exec -i inventory.yaml --limit 'tag:gpu' -- cat /etc/os-release"]


def test_console_parser_reads_commands_exit_codes_continuations_and_checked_lines() -> None:
    text = "\n".join([
        "```console",
        "$ fleetfix probe -i $LAB_INVENTORY   # exit 3",
        "== t error (0.1s)",
        "   nvcc         none      # checked",
        "$ fleetfix apply x.yaml \\",
        "    --check",
        "train-a  ok  # checked",
        "$ scripts/lab.sh up",
        "```",
        "```sh",
        "$ fleetfix not-in-a-console-block",
        "```",
    ])
    commands = console_commands("doc.md", text)
    assert [(c.line, c.exit_code, c.checked, c.is_fleetfix) for c in commands] == [
        (2, 3, ["   nvcc         none"], True),
        (5, 0, ["train-a  ok"], True),
        (8, 0, [], False),
    ]
    assert commands[1].command == "fleetfix apply x.yaml \\\n    --check"


def completion_lines() -> dict[str, str]:
    """The README's shell-completion commands, by shell (the comment after each names it)."""
    text = README.read_text()
    block = text[text.index("## Shell completion"):].split("```sh\n", 1)[1].split("```", 1)[0]
    lines: dict[str, str] = {}
    for line in block.splitlines():
        command, _, comment = line.partition("  #")
        lines[comment.strip().split(":")[0].split(",")[0].split()[0]] = command.strip()
    return lines


def test_shell_completion_lines_work_on_a_fresh_account(tmp_path: Path) -> None:
    """As written, for a user whose home has no ~/.config yet (the fish line used to fail there)."""
    home = tmp_path / "home"
    home.mkdir()
    # The installed command (click names the completion variable after it; `python -m` would not do)
    script = Path(sys.executable).parent / "fleetfix"
    if not script.is_file():
        pytest.skip(f"no fleetfix command next to {sys.executable} (not installed as the README says)")
    env = {"HOME": str(home), "PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}"}
    lines = completion_lines()
    assert set(lines) == {"bash", "zsh", "fish"}, lines

    def sh(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, text=True,
                              capture_output=True, timeout=120, check=False)

    done = sh(lines["fish"])
    assert done.returncode == 0, done.stderr
    fish = (home / ".config" / "fish" / "completions" / "fleetfix.fish").read_text()
    assert "complete" in fish and "fleetfix" in fish
    done = sh(lines["bash"] + "\ncomplete -p fleetfix")
    assert done.returncode == 0 and "fleetfix" in done.stdout, done.stderr
    zsh_source = lines["zsh"].removeprefix('eval "$(').removesuffix(')"')  # zsh itself may be absent
    done = sh(zsh_source)
    assert done.returncode == 0 and "compdef" in done.stdout, done.stderr
    if shutil.which("fish"):
        done = subprocess.run(["fish", "-c", f"source {home}/.config/fish/completions/fleetfix.fish; "
                               "complete -C 'fleetfix '"], env=env, text=True, capture_output=True,
                              timeout=120, check=False)
        assert "probe" in done.stdout, done.stderr


# A step line in a console block, as `apply` and `runs show` print it: status, target, step name, " — ".
STEP_LINE = re.compile(r"^\s*(?:ok|changed|would-change|failed|skipped|ignored)\s+(?:[\w./-]+: )?(.+?) — ")


def shipped_step_names() -> set[str]:
    import yaml

    return {step["name"] for book in (REPO / "playbooks").glob("*.yaml")
            for step in yaml.safe_load(book.read_text())["steps"]}


def stale_step_lines(path: Path, known: set[str]) -> list[str]:
    """Console output lines naming a step no shipped playbook has: output pasted before a step was
    renamed or removed, which `# checked` lines alone do not catch (most step lines vary per run)."""
    stale, in_console = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_console = not in_console and line.startswith("```console")
            continue
        found = STEP_LINE.match(line) if in_console else None
        if found and found.group(1) not in known:
            stale.append(f"{path.name}:{number}: {found.group(1)!r}")
    return stale


def test_every_step_shown_in_console_output_is_a_step_of_a_shipped_playbook(tmp_path: Path) -> None:
    known = shipped_step_names()
    assert "cuda version known" in known and "extensions built" in known
    assert [stale for path in [README, *DOCS] for stale in stale_step_lines(path, known)] == []
    pasted = tmp_path / "old.md"
    pasted.write_text("```console\n$ fleetfix runs show last\n"
                      "  ok           supported platform — debian12\n```\n")
    assert stale_step_lines(pasted, known) == ["old.md:3: 'supported platform'"]
