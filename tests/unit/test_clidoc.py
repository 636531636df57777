import subprocess
import sys
from pathlib import Path

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def generated() -> str:
    # A fresh interpreter: click caches each command's help option on first use, so a render inside this
    # test process could depend on which other tests ran first.
    return subprocess.run([sys.executable, "-m", "fleetfix.clidoc"], capture_output=True, text=True,
                          check=True).stdout


def test_docs_cli_md_is_generated_from_the_current_commands() -> None:
    stale = "docs/cli.md is stale: run `python -m fleetfix.clidoc > docs/cli.md`"
    assert CLI_MD.read_text() == generated(), stale


def test_every_command_is_documented_with_an_example() -> None:
    text = generated()
    for command in ("fleetfix exec", "fleetfix probe", "fleetfix apply", "fleetfix inventory list",
                    "fleetfix runs list", "fleetfix runs show", "fleetfix audit",
                    "fleetfix schedule install"):
        section = text.split(f"## `{command}`", 1)[1].split("## `", 1)[0]
        assert "Example" in section, command
