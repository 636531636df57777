"""Issue 18, Medium (secrets): a channel for secrets besides the command line, and masking by value.

Before: `schedule install --var api_token=...` wrote the value into a 0644 unit file; the only way to pass
a secret was `--var` on the command line; a template error and `--json` showed a secret unmasked; the audit
database stored remediation vars; masking worked on names only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetfix.errors import ConfigError
from fleetfix.secrets import MASK, load_var_file, mask_vars, resolve_reference

REPO = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-Value-9f2c"


def fleetfix(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", **(env or {})})


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_references_resolve_at_run_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETFIX_TEST_SECRET", SECRET)
    assert resolve_reference("@env:FLEETFIX_TEST_SECRET") == SECRET
    assert resolve_reference(f"@file:{private_file(tmp_path / 's', SECRET + chr(10))}") == SECRET
    with pytest.raises(ConfigError, match=r"\$FLEETFIX_NO_SUCH is not set"):
        resolve_reference("@env:FLEETFIX_NO_SUCH")
    with pytest.raises(ConfigError, match="never the value itself"):
        resolve_reference(SECRET)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_secret_files_others_may_read_are_refused(tmp_path: Path, mode: int) -> None:
    secret = private_file(tmp_path / "vars.yaml", f"api_token: {SECRET}\n", mode)
    for load in (lambda: load_var_file(str(secret)), lambda: resolve_reference(f"@file:{secret}")):
        with pytest.raises(ConfigError, match=f"permissions 0{mode:o} are too open") as caught:
            load()
        assert SECRET not in str(caught.value)


def test_masking_by_value_whatever_the_name() -> None:
    masked = mask_vars({"endpoint": SECRET, "cuda_version": "12.8", "nested": {"x": SECRET}}, [SECRET])
    assert masked == {"endpoint": MASK, "cuda_version": "12.8", "nested": {"x": MASK}}


def playbook_echoing(tmp_path: Path, var: str) -> Path:
    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump({"name": "echo", "steps": [
        {"name": "show", "check": f"echo {{{{ {var} }}}}; exit 1", "apply": "true"}]}))
    return path


@pytest.mark.parametrize("how", ["env", "file", "var-file"])
def test_secrets_from_the_channel_never_reach_output_or_records(tmp_path: Path, how: str) -> None:
    """The var is called `endpoint`: nothing in its name says secret; its channel does."""
    state = tmp_path / "state"
    env = {}
    if how == "env":
        args, env = ["--var", "endpoint=@env:FLEETFIX_TEST_SECRET"], {"FLEETFIX_TEST_SECRET": SECRET}
    elif how == "file":
        args = ["--var", f"endpoint=@file:{private_file(tmp_path / 'secret', SECRET)}"]
    else:
        args = ["--var-file", str(private_file(tmp_path / "vars.yaml", f"endpoint: {SECRET}\n"))]
    playbook = playbook_echoing(tmp_path, "endpoint")
    for extra in ([], ["--json"], ["-v"]):
        command = ["apply", str(playbook), "--local", "--check", "--state-dir", str(state), *args, *extra]
        if extra == ["-v"]:
            command = ["-v", *command[:-1]]
        done = fleetfix(*command, env=env)
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout + done.stderr
    written = b"".join(path.read_bytes() for path in state.rglob("*") if path.is_file())
    assert SECRET.encode() not in written
    assert MASK.encode() in written


def test_a_template_error_does_not_show_the_secret(tmp_path: Path) -> None:
    playbook = tmp_path / "bad.yaml"
    playbook.write_text(yaml.safe_dump({"name": "bad", "steps": [
        {"name": "s", "check": "true", "when": "endpoint | int > 1 and endpoint.nope.deeper"}]}))
    for extra in ([], ["--json"]):
        done = fleetfix("apply", str(playbook), "--local", "--check", "--state-dir", str(tmp_path / "st"),
                        "--var", "endpoint=@env:FLEETFIX_TEST_SECRET", *extra,
                        env={"FLEETFIX_TEST_SECRET": SECRET})
        assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_mistyped_var_never_echoes_its_value() -> None:
    done = fleetfix("apply", "playbooks/cuda-toolkit.yaml", "--local", "--check", "--var",
                    f"api token={SECRET}")
    assert done.returncode == 2
    assert SECRET not in done.stderr


def test_schedule_install_writes_only_references_into_0600_units(tmp_path: Path) -> None:
    inventory, units = tmp_path / "inv.yaml", tmp_path / "units"
    inventory.write_text("nodes: [{name: pve1, address: 10.1.2.6}]\n")  # read at install, never dialled
    units.mkdir()
    literal = fleetfix("schedule", "install", "--unit-dir", str(units), "--", "-i", str(inventory),
                       "--remediate", "playbooks/cuda-toolkit.yaml", "--var", f"api_token={SECRET}")
    assert literal.returncode == 2
    assert SECRET not in literal.stdout + literal.stderr
    assert not list(units.iterdir())
    done = fleetfix("schedule", "install", "--unit-dir", str(units), "--", "-i", str(inventory),
                    "--remediate", "playbooks/cuda-toolkit.yaml",
                    "--var", "api_token=@file:/etc/fleetfix/token")
    assert done.returncode == 0, done.stderr
    for unit in units.iterdir():
        assert unit.stat().st_mode & 0o777 == 0o600, unit
    assert "api_token=@file:/etc/fleetfix/token" in (units / "fleetfix-audit.service").read_text()


def test_the_audit_database_never_holds_a_remediation_secret(tmp_path: Path) -> None:
    from fleetfix.audit.remediate import Remedy, apply_to_failing

    def never(targets: object) -> None:
        raise AssertionError("nothing fails: nothing is applied")

    remedy = Remedy("p.yaml", never, vars=mask_vars({"endpoint": SECRET}, [SECRET]))  # type: ignore[arg-type]
    remediation, _ = apply_to_failing([], [], remedy, 1)
    assert SECRET not in json.dumps(remediation.to_json())


def test_schedule_env_file_is_named_by_the_unit_never_copied_and_must_be_private(tmp_path: Path) -> None:
    inventory, units, env_file = tmp_path / "inv.yaml", tmp_path / "units", tmp_path / "audit.env"
    inventory.write_text("nodes: [{name: pve1, address: 10.1.2.6}]\n")  # read at install, never dialled
    units.mkdir()
    env_file.write_text(f"API_TOKEN={SECRET}\n")
    env_file.chmod(0o644)
    args = ("--", "-i", str(inventory), "--remediate", "playbooks/cuda-toolkit.yaml",
            "--var", "api_token=@env:API_TOKEN")
    loose = fleetfix("schedule", "install", "--unit-dir", str(units), "--env-file", str(env_file), *args)
    assert loose.returncode == 2 and "too open" in loose.stderr and not list(units.iterdir())
    env_file.chmod(0o600)
    cron = fleetfix("schedule", "install", "--cron", "--env-file", str(env_file), *args)
    assert cron.returncode == 2 and "@file:" in cron.stderr
    done = fleetfix("schedule", "install", "--unit-dir", str(units), "--env-file", str(env_file), *args)
    assert done.returncode == 0, done.stderr
    unit = (units / "fleetfix-audit.service").read_text()
    assert f"EnvironmentFile={env_file}" in unit.splitlines()
    assert SECRET not in unit + done.stdout + done.stderr

