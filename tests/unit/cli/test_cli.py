"""The CLI shell: one-line errors with their exit codes, inventory listing, --var parsing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from fleetfix.cli import COMMANDS, main
from fleetfix.cli import command as command_named

REPO = Path(__file__).resolve().parents[3]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_inventory_list_json_of_the_example() -> None:
    code, out, _ = invoke("inventory", "list", "-i", str(REPO / "inventory.example.yaml"), "--json")
    assert code == 0
    listing = json.loads(out)
    assert listing["targets"] and listing["skipped"] == []
    assert all(t["address"] and t["node"] for t in listing["targets"])


def test_inventory_list_shows_vars_with_secret_named_ones_masked(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(
        "defaults:\n  vars: {python: python3, api_token: s3cr3t-value}\n"
        "nodes:\n  - name: pve1\n    address: 10.1.2.6\n"
        "    vars: {cuda_version: '12.8', opts: {db_password: hunter22, level: 3}}\n"
        "    containers: [{ctid: 200, name: train-a}]\n")
    code, out, _ = invoke("inventory", "list", "-i", str(inventory))
    assert code == 0
    header, *rows = out.splitlines()
    assert "VARS" in header.split()
    cells = [row[header.index("VARS"):header.index("SOURCE")].strip() for row in rows[:4]]
    assert cells == ["python=python3", "api_token=********", "cuda_version=12.8",
                     'opts={"db_password": "********", "level": 3}']
    code, out, _ = invoke("inventory", "list", "-i", str(inventory), "--json")
    assert json.loads(out)["targets"][0]["vars"] == {
        "python": "python3", "api_token": "********", "cuda_version": "12.8",
        "opts": {"db_password": "********", "level": 3}}
    assert "s3cr3t" not in out and "hunter22" not in out


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
        [forks] = [p for p in command_named(command).params if p.name == "forks"]
        assert forks.default == DEFAULT_FORKS, command


def test_runs_show_last_is_the_newest_run(tmp_path: Path) -> None:
    from fleetfix.playbook.records import RunRecorder

    for run_id, playbook in (("20261202T110000Z-aaaaaa", "older"), ("20261202T120000Z-000000", "newer")):
        with RunRecorder(tmp_path, run_id=run_id) as recorder:
            recorder.event("run-start", playbook=playbook, check=False, targets=[])
            recorder.event("run-end", status="ok")
    code, out, _ = invoke("runs", "show", "last", "--state-dir", str(tmp_path))
    assert code == 0 and out.startswith("run 20261202T120000Z-000000 newer apply: ok")
    code, _, err = invoke("runs", "show", "last", "--state-dir", str(tmp_path / "none"))
    assert code == 2 and "no runs recorded" in err


def test_a_command_loads_only_its_own_module() -> None:
    program = (
        "import sys\nfrom fleetfix.cli import main\n"
        "try:\n    main(['probe', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('loaded:', *(m for m in sys.modules if m.startswith('fleetfix.cli.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.splitlines()[-1].split()[1:])
    assert "fleetfix.cli.probe" in loaded
    assert not loaded & {"fleetfix.cli.apply", "fleetfix.cli.audit", "fleetfix.cli.wheels"}


def test_every_listed_command_loads_and_is_named_as_listed() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    for name in COMMANDS:
        assert command_named(name).name == name
        assert f"  {name} " in out
