from pathlib import Path

from fleetfix.clidoc import render

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_generated_from_the_current_commands() -> None:
    stale = "docs/cli.md is stale: run `python -m fleetfix.clidoc > docs/cli.md`"
    assert CLI_MD.read_text() == render(), stale


def test_every_command_is_documented_with_an_example() -> None:
    text = render()
    for command in ("fleetfix exec", "fleetfix probe", "fleetfix apply", "fleetfix inventory list",
                    "fleetfix runs list", "fleetfix runs show"):
        section = text.split(f"## `{command}`", 1)[1].split("## `", 1)[0]
        assert "Example" in section, command
