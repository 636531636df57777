"""Issue 18: bad input cannot hurt the controller (High: alias expansion; Low: huge integers, deep nesting,
a directory as known_hosts, a broken pipe). Each case is run the way a user meets it, through the CLI in a
child process, and must end in one line and the right exit code, never a traceback.

The alias bomb runs under a 1 GiB address-space limit: before the fix, depth 9 ended in a MemoryError
traceback (and depth 7 took 1.5 GB and 28 s), so without the budget the child dies quickly, with exit 1
and a traceback, instead of taking the machine down with it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetfix import yamlsource
from fleetfix.errors import ConfigError, KeyPermissionError, ProbeOutputError
from fleetfix.probe.facts import parse_facts
from fleetfix.transport.ssh import load_private_key
from fleetfix.yamlsource import MAX_ALIAS_VALUES, parse_yaml

REPO = Path(__file__).resolve().parents[3]


def billion_laughs(levels: int) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def fleetfix(*args: str, cwd: Path = REPO, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True,
                          cwd=cwd, input=stdin, timeout=120, preexec_fn=limit_memory,
                          env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    return lines[0]


@pytest.mark.parametrize("kind", ["inventory", "playbook", "policy"])
def test_a_billion_laughs_file_is_one_line_exit_2(tmp_path: Path, kind: str) -> None:
    bomb = tmp_path / f"{kind}.yaml"
    bomb.write_text(billion_laughs(9))
    args = {
        "inventory": ["inventory", "list", "-i", str(bomb)],
        "playbook": ["apply", str(bomb), "--local", "--check"],
        "policy": ["audit", "--policy", str(bomb), "--host", "127.0.0.1"],
    }[kind]
    line = one_line_error(fleetfix(*args), 2)
    # The line where the budget ran out: l4, whose 9**5 values are the first over it.
    assert f"{bomb}:5: invalid YAML: aliases expand it by more than {MAX_ALIAS_VALUES} values" in line


def test_ordinary_anchors_and_merge_keys_still_load() -> None:
    data, _ = parse_yaml("base: &b {user: ops, port: 22}\nnodes:\n- {<<: *b, name: a}\n- {<<: *b, name: b}\n",
                         "ok.yaml")
    assert data["nodes"][1] == {"user": "ops", "port": 22, "name": "b"}


@pytest.mark.parametrize(("text", "message"), [
    ("a: &a [*a]\n", "an alias refers to a node that contains it"),
    ("a: " + "[" * 70 + "]" * 70 + "\n", "nested more than 64 levels deep"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "f.yaml:1: invalid YAML: nested more than 64 levels deep"),
    ("a:\n" + "".join(" " * i + "-\n" for i in range(1, 1200)), "nested more than 64 levels deep"),
    ("port: " + "9" * 5000 + "\n", "an integer of 5000 digits"),
    ("port: 0x" + "f" * 40 + "\n", "an integer of 42 digits"),
    ("when: 2001-13-45\n", "month must be in 1..12"),
])
def test_yaml_over_a_limit_is_a_one_line_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "f.yaml")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "inventory.yaml"
    big.write_text("# " + "x" * (5 * 1024 * 1024) + "\n")
    assert "file is over 4 MiB" in one_line_error(fleetfix("inventory", "list", "-i", str(big)), 2)


def test_huge_and_out_of_range_integers_are_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "a", "address": "127.0.0.1",
                                                    "port": 10**19, "connect_timeout": 10**19}]}))
    line = one_line_error(fleetfix("inventory", "list", "-i", str(inventory)), 2)
    assert "port" in line


@pytest.mark.parametrize(("stdout", "message"), [
    ('{"fleetfix_probe": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"fleetfix_probe": ' + "1" * 5000 + "}", "an integer of 5000 digits"),
])
def test_hostile_probe_json_is_a_per_target_error(stdout: str, message: str) -> None:
    with pytest.raises(ProbeOutputError, match=message):
        parse_facts(stdout)


def test_known_hosts_that_is_a_directory_is_bad_input_not_a_firewall(tmp_path: Path) -> None:
    line = one_line_error(fleetfix("exec", "--host", "127.0.0.1", "--known-hosts", str(tmp_path),
                                   "--", "true"), 2)
    assert line == f"fleetfix: error: known_hosts {tmp_path} is not a file"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o610])
def test_a_private_key_others_can_access_is_refused_like_openssh(tmp_path: Path, mode: int) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    key.chmod(mode)
    with pytest.raises(KeyPermissionError) as caught:
        load_private_key(str(key))
    assert str(caught.value) == (
        f"identity file {key}: WARNING: UNPROTECTED PRIVATE KEY FILE! Permissions 0{mode:o} for '{key}' are "
        "too open. It is required that your private key files are NOT accessible by others. This private "
        "key will be ignored.")
    key.chmod(0o600)
    assert load_private_key(str(key)).can_sign()
    key.chmod(0o400)
    assert load_private_key(str(key)).can_sign()


def test_a_reader_that_goes_away_is_no_error(tmp_path: Path) -> None:
    """`fleetfix ... | head`: the reader is gone before fleetfix writes (a pipe whose read end is closed,
    so the write fails with EPIPE every time, not only when head wins a race)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "a", "address": "127.0.0.1"}]}))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "fleetfix", "inventory", "list", "-i", str(inventory)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120,
                              env={**os.environ, "NO_COLOR": "1"})
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 0


@pytest.mark.parametrize("args", [
    ["exec", "--host", "127.0.0.1", "--connect-timeout", "1e300", "--", "true"],
    ["exec", "--local", "--timeout", "1e400", "--", "true"],
    ["audit", "history", "-n", "99999999999999999999999"],
    ["apply", "playbooks/cuda-toolkit.yaml", "--local", "--check", "--serial", "9" * 30],
])
def test_huge_numbers_on_the_command_line_are_usage_errors(args: list[str]) -> None:
    """Before: an OverflowError (timestamp out of range, too large for SQLite INTEGER) as a traceback or
    as every target's "unreachable" reason."""
    done = fleetfix(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Overflow" not in done.stderr + done.stdout


@pytest.mark.parametrize(("field", "value"), [("delay", 1e300), ("timeout", 1e300), ("retries", 10**18)])
def test_huge_numbers_in_a_playbook_are_one_line(tmp_path: Path, field: str, value: float) -> None:
    playbook = tmp_path / "p.yaml"
    playbook.write_text(yaml.safe_dump({"name": "p", "steps": [
        {"name": "s", "check": "false", "apply": "true", field: value}]}))
    line = one_line_error(fleetfix("apply", str(playbook), "--local", "--check"), 2)
    assert f"steps.0.{field}" in line


@pytest.mark.parametrize("text", [
    "defaults: {user: root}\nnodes:\n- name: a\n  containers:\n  - ctid: 200\n    vars: {python: python3}\n",
    "base: &b {user: ops, port: 22}\nnodes:\n- {<<: *b, name: a}\n- when: 2001-12-14\n  n: 0x1f\n",
    "a: " + "[" * 70 + "]" * 70 + "\n",
    "a: &a [*a]\n",
    "a: [1, 2\n",
    "key: value\n bad indent: here\n",
])
def test_libyaml_and_the_pure_python_parser_give_the_same_data_lines_and_errors(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    if yamlsource._LOADER is yaml.SafeLoader:
        pytest.skip("PyYAML without libyaml here: only the pure-Python parser to compare")

    def parsed() -> tuple[object, dict[object, int]] | str:
        try:
            data, where = parse_yaml(text, "f.yaml")
        except ConfigError as error:
            return str(error).split(": invalid YAML")[0]  # file:line; libyaml words its errors its own way
        return data, where._lines

    with_libyaml = parsed()
    monkeypatch.setattr(yamlsource, "_LOADER", yaml.SafeLoader)
    assert parsed() == with_libyaml
