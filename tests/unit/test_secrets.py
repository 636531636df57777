"""Secrets stay out of what fleetfix writes and prints: the SSH key passphrase and secret-named vars.

The end-to-end check (a real apply and audit, then a grep of every file written and every stream) is
tests/e2e/test_faults.py::test_secrets_never_written_to_run_records_or_audit_history; these are the
fast checks of the pieces it relies on.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetfix.cli import main
from fleetfix.errors import AuthenticationError
from fleetfix.playbook.records import RunRecorder, load_run
from fleetfix.secrets import MASK, mask_vars, secret_values
from fleetfix.transport.ssh import PASSPHRASE_ENV, load_private_key

PASSPHRASE = "pp-Correct horse $(battery) 'staple'"
TOKEN = "tok-s3cr3t-'quoted' \"and\" $(not run)"


@pytest.fixture
def encrypted_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    # -a 1: one KDF round, so loading the key in each test stays fast.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-a", "1", "-N", PASSPHRASE, "-f", str(key)],
                   check=True)
    return key


def test_passphrase_from_the_environment_unlocks_the_key(
    encrypted_key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSPHRASE_ENV, PASSPHRASE)
    assert load_private_key(str(encrypted_key)).get_name() == "ssh-ed25519"


@pytest.mark.parametrize("given", [None, "pp-wrong-passphrase-value"])
def test_key_errors_never_quote_the_passphrase(
    encrypted_key: Path, monkeypatch: pytest.MonkeyPatch, given: str | None
) -> None:
    if given is None:
        monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    else:
        monkeypatch.setenv(PASSPHRASE_ENV, given)
    with pytest.raises(AuthenticationError) as caught:
        load_private_key(str(encrypted_key))
    message = str(caught.value)
    assert str(encrypted_key) in message and "\n" not in message
    assert PASSPHRASE not in message
    if given is not None:
        assert given not in message
    else:
        assert PASSPHRASE_ENV in message  # says how to give it, by name


def test_secret_named_vars_are_found_at_any_depth() -> None:
    values = {"api_token": TOKEN, "db": {"Password": "pw-1234", "host": "h"}, "cuda_version": "12.8",
              "MY_SECRET_KEY": "sk-9876"}
    assert sorted(secret_values(values)) == sorted([TOKEN, "pw-1234", "sk-9876"])
    assert mask_vars(values) == {"api_token": MASK, "db": {"Password": MASK, "host": "h"},
                                 "cuda_version": "12.8", "MY_SECRET_KEY": MASK}


def test_the_record_masks_secret_values_wherever_they_appear(tmp_path: Path) -> None:
    with RunRecorder(tmp_path) as recorder:
        recorder.add_secrets([TOKEN, "pw-1234"])
        script = f"curl -H 'Authorization: Bearer '{shlex.quote(TOKEN)} https://x\n"
        recorder.event("run-start", playbook="p", targets=["t"], vars=mask_vars({"api_token": TOKEN}))
        recorder.event("script-start", target="t", playbook="p", step="s", phase="apply", attempt=1,
                       script=script)
        recorder.event("script-end", target="t", playbook="p", step="s", phase="apply", attempt=1, rc=1,
                       stdout=f"echoed {TOKEN}\n", stderr="password was pw-1234", duration=0.1,
                       timed_out=False, error=None)
        recorder.event("step", target="t", playbook="p", step="s", status="failed",
                       reason=f"apply failed: {TOKEN}", facts={"nested": [TOKEN, {"deep": "pw-1234"}]})
        run_id = recorder.run_id
    written = (tmp_path / "runs" / run_id / "events.jsonl").read_text()
    for secret in (TOKEN, shlex.quote(TOKEN), "pw-1234"):
        assert secret not in written
    assert written.count(MASK) >= 6
    assert all(json.loads(line) for line in written.splitlines())
    detail = load_run(tmp_path, run_id)
    assert MASK in detail.targets["t"].steps[0].scripts[0].stdout

    shown = CliRunner().invoke(main, ["runs", "show", run_id, "--state-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert TOKEN not in shown.output and "pw-1234" not in shown.output


def test_short_values_are_not_masked_everywhere(tmp_path: Path) -> None:
    """A 3-character "secret" would mask every occurrence of e.g. "abc" in output: such values are left
    alone (documented in docs/security.md: use real secrets, not toy ones)."""
    with RunRecorder(tmp_path) as recorder:
        recorder.add_secrets(["abc"])
        recorder.event("note", text="abc")
        run_id = recorder.run_id
    assert '"abc"' in (tmp_path / "runs" / run_id / "events.jsonl").read_text()
