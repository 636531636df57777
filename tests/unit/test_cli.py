"""The CLI shell: one-line errors with their exit codes, inventory listing, --var parsing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fleetfix.cli import main

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_inventory_list_json_of_the_example() -> None:
    code, out, _ = invoke("inventory", "list", "-i", str(REPO / "inventory.example.yaml"), "--json")
    assert code == 0
    listing = json.loads(out)
    assert listing["targets"] and listing["skipped"] == []
    assert all(t["address"] and t["node"] for t in listing["targets"])


def test_bad_inventory_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text("nodes:\n  - name: pve1\n    address: 10.1.2.6\n    prot: 22\n")
    code, out, err = invoke("inventory", "list", "-i", str(bad))
    assert code == 2
    assert err.strip().count("\n") == 0
    assert f"{bad}:4" in err and "prot" in err
    assert "Traceback" not in out + err


def test_limit_matching_nothing_is_exit_2() -> None:
    code, _, err = invoke("inventory", "list", "-i", str(REPO / "inventory.example.yaml"), "--limit", "nope")
    assert code == 2 and "matched no targets" in err


def test_bad_var_is_exit_2_before_anything_runs(tmp_path: Path) -> None:
    code, _, err = invoke("apply", str(REPO / "playbooks" / "cuda-toolkit.yaml"), "--local", "--var", "x")
    # Without '=' the word may be a value typed without its name: it is not echoed (issue 18).
    assert code == 2 and "--var '…'" in err and err.count("\n") == 1
    code, _, err = invoke("apply", str(REPO / "playbooks" / "cuda-toolkit.yaml"),
                          "--host", "127.0.0.1", "--var", "no equals sign")
    assert code == 2 and "--var" in err


def test_missing_playbook_is_one_line() -> None:
    code, _, err = invoke("apply", "playbooks/does-not-exist.yaml", "--host", "127.0.0.1")
    assert code == 2 and "does-not-exist.yaml" in err and "Traceback" not in err


def test_forks_default_is_the_fleet_runners() -> None:
    from fleetfix.fleet import DEFAULT_FORKS

    for command in ("probe", "exec", "apply", "audit"):
        [forks] = [p for p in main.commands[command].params if p.name == "forks"]
        assert forks.default == DEFAULT_FORKS, command
