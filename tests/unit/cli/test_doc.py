import difflib
import subprocess
import sys
from pathlib import Path

CLI_MD = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def generated() -> str:
    # A fresh interpreter: click caches each command's help option on first use, so a render inside this
    # test process could depend on which other tests ran first.
    return subprocess.run([sys.executable, "-m", "fleetfix.cli.doc"], capture_output=True, text=True,
                          check=True).stdout


def words_per_section(markdown: str) -> dict[str, list[str]]:
    """Each `## command` section as its words: how click wraps a help text (which changes between click
    releases and with terminal widths) is not what the reference documents, every word in it is."""
    sections: dict[str, list[str]] = {}
    for chunk in ("\n" + markdown).split("\n## ")[1:]:
        heading, _, body = chunk.partition("\n")
        sections[heading] = body.split()
    return sections


def test_docs_cli_md_is_generated_from_the_current_commands() -> None:
    documented, current = words_per_section(CLI_MD.read_text()), words_per_section(generated())
    assert list(documented) == list(current), "docs/cli.md lists other commands than the CLI has"
    for heading, words in current.items():
        diff = "\n".join(difflib.unified_diff(documented[heading], words, lineterm="", n=3))
        assert documented[heading] == words, (
            f"docs/cli.md is stale in {heading}: run `python -m fleetfix.cli.doc > docs/cli.md`\n{diff}"
        )


def test_whitespace_alone_is_not_drift_but_a_changed_word_is() -> None:
    text = CLI_MD.read_text()
    rewrapped = text.replace("Select targets: name,", "Select targets:\n      name,")
    assert words_per_section(rewrapped) == words_per_section(text)
    changed = text.replace("Select targets:", "Choose targets:", 1)
    assert words_per_section(changed) != words_per_section(text)


def test_every_command_is_documented_with_an_example() -> None:
    text = generated()
    for command in ("fleetfix exec", "fleetfix probe", "fleetfix apply", "fleetfix inventory list",
                    "fleetfix runs list", "fleetfix runs show", "fleetfix audit",
                    "fleetfix schedule install"):
        section = text.split(f"## `{command}`", 1)[1].split("## `", 1)[0]
        assert "Example" in section, command
