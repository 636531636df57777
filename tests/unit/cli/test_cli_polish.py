"""Issue 10's CLI polish: one declaration of the rollout options, exec's live stderr, --local on exec and
apply, errors that say what to do next, and plain tables off a terminal (or with NO_COLOR)."""

from __future__ import annotations

import dataclasses
import io
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import paramiko
import pytest
from click.testing import CliRunner
from rich.table import Table

from fleetfix.audit import AuditStore
from fleetfix.cli import command, main
from fleetfix.cli.audit import audit_group
from fleetfix.cli.common import RolloutOptions
from fleetfix.errors import (
    AuthenticationError,
    ChangedHostKeyError,
    CommandFailedError,
    ConnectError,
    ConnectionLostError,
    ConnectRefusedError,
    ConnectTimeoutError,
    FleetfixError,
    InventoryError,
    InventoryNotFoundError,
    NameResolutionError,
    UnknownHostKeyError,
)
from fleetfix.inventory import resolve
from fleetfix.inventory.load import local_target, resolve_inventory_path
from fleetfix.inventory.resolve import Resolution
from fleetfix.reports.console import _console, print_table
from fleetfix.secrets import MASK
from fleetfix.target import SSHSettings
from fleetfix.transport.hostkeys import KnownHosts
from fleetfix.transport.ssh import SSHConnection, load_private_key

REPO = Path(__file__).resolve().parents[3]
ROLLOUT_FIELDS = [field.name for field in dataclasses.fields(RolloutOptions)]
TINY_PLAYBOOK = """\
name: tiny
steps:
  - name: marker present
    check: test -e {marker}
    apply: touch {marker}
"""


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def fleetfix_process(*args: str, **popen: Any) -> subprocess.Popen[str]:
    """The real entry point in a child process, stdout a pipe (not a TTY), colours not switched off."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    return subprocess.Popen([sys.executable, "-m", "fleetfix", *args], text=True, env=env, cwd=REPO,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen})


def run_fleetfix(*args: str) -> subprocess.CompletedProcess[str]:
    process = fleetfix_process(*args)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- 1. rollout options, declared once


def _options(command: click.Command) -> dict[str, click.Option]:
    return {param.name: param for param in command.params if isinstance(param, click.Option) and param.name}


def test_apply_and_audit_declare_the_same_rollout_options() -> None:
    apply_options, audit_options = _options(command("apply")), _options(audit_group)
    for name in ROLLOUT_FIELDS:
        ours, theirs = apply_options[name], audit_options[name]
        assert ours.opts == theirs.opts, name
        assert (ours.is_flag, ours.multiple, ours.default, ours.metavar) == \
               (theirs.is_flag, theirs.multiple, theirs.default, theirs.metavar), name
        assert ours.type.to_info_dict() == theirs.type.to_info_dict(), name  # same ranges and kinds
        # audit's help is apply's, behind the --remediate prefix: one text, no drift in meaning
        assert ours.help and theirs.help == "With --remediate: " + ours.help[0].lower() + ours.help[1:]


def test_rollout_options_mean_the_same_in_both_commands() -> None:
    policy = RolloutOptions(keep_snapshots=3).snapshot_policy()
    assert (policy.take, policy.keep, policy.rollback_on_failure) == (True, 3, False)
    assert RolloutOptions(rollback_on_failure=True).snapshot_policy().take
    assert not RolloutOptions().snapshot_policy().active
    assert RolloutOptions(var_items=("cuda_version=12.10",)).variables() == {"cuda_version": "12.10"}
    assert RolloutOptions().given() == []
    # --max-fail 0 is an option given (0.0 == False must not hide it)
    assert RolloutOptions(max_fail=0.0, check=True).given() == ["--check", "--max-fail"]


def test_audit_names_the_rollout_options_that_need_remediate(tmp_path: Path, closed_port: int) -> None:
    code, _, err = invoke("audit", "--db", str(tmp_path / "a.db"), "--host", "127.0.0.1", "--port",
                          str(closed_port), "--check", "--max-fail", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--check, --max-fail" in err and "need --remediate PLAYBOOK" in err
    with AuditStore(tmp_path / "a.db") as store:
        assert store.runs() == []  # refused before anything was probed


# ---------------------------------------------------------------- 2. exec: stderr live, stdout clean

# Prints to both streams, then waits for a file the test creates only once it has read the stderr line
# from fleetfix's own stderr: had fleetfix held stderr back until the command ended, it would time out.
HANDSHAKE = 'echo a; echo b >&2; while [ ! -f "$0" ]; do sleep 0.02; done; echo c'


@pytest.mark.timeout(60)
def test_exec_streams_stderr_while_the_command_still_runs(tmp_path: Path) -> None:
    go = tmp_path / "go"
    process = fleetfix_process("exec", "--local", "--timeout", "20", "--", "sh", "-c", HANDSHAKE, str(go))
    assert process.stderr is not None
    first = process.stderr.readline()
    still_running = process.poll() is None
    go.touch()
    out, err = process.communicate(timeout=30)
    assert first == "b\n"  # one target: the line as the command wrote it
    assert still_running, "stderr arrived only after the command had ended"
    assert process.returncode == 0, err
    assert out == "== local exit 0\na\nc\n"  # stdout: the header and the command's stdout, nothing else
    assert err == ""  # the stderr line was printed once, live, not again at the end


def test_exec_stderr_comes_before_the_stdout_it_preceded_when_both_go_to_one_pipe() -> None:
    process = fleetfix_process("exec", "--local", "--", "sh", "-c", "echo a; echo b >&2; sleep 0.3; echo c",
                               stderr=subprocess.STDOUT)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert out.splitlines() == ["b", "== local exit 0", "a", "c"]


@pytest.mark.timeout(60)
def test_exec_on_a_terminal_prints_the_header_first_then_what_the_target_printed_in_order() -> None:
    """Streamed, stderr would land above the `== NAME exit N` header it belongs to (the header waits for
    the exit status); on one screen the header comes first, then both streams in the order they came."""
    leader, follower = pty.openpty()
    env = {**{k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}, "NO_COLOR": "1"}
    command = "echo a; echo b >&2; echo c; printf 'no newline' >&2"
    process = subprocess.Popen([sys.executable, "-m", "fleetfix", "exec", "--local", "--", "sh", "-c",
                                command], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                               env=env, cwd=REPO)
    os.close(follower)
    printed = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not chunk:
            break
        printed += chunk
    os.close(leader)
    assert process.wait(timeout=30) == 0
    header, *lines = printed.decode().replace("\r\n", "\n").splitlines()
    assert header == "== local exit 0"
    # Two pipes: which of them is read first is up to the scheduler, so only each stream's own order is
    # certain here (the order across streams: test_exec_transcripts_go_under_each_targets_header).
    assert sorted(lines) == ["a", "b", "c", "no newline"] and lines.index("a") < lines.index("c")


def test_exec_transcripts_go_under_each_targets_header() -> None:
    from fleetfix.cli.live import Transcripts
    from fleetfix.command import ExecRun
    from fleetfix.fleet import Outcome
    from fleetfix.reports.text import render_text
    from fleetfix.transport.base import CommandResult

    transcripts = Transcripts(redact=lambda text: text.replace("s3cret", MASK))
    one, two = (dataclasses.replace(local_target(), name=name) for name in ("one", "two"))
    sink = transcripts.sink_for("one")
    sink("stdout", b"out 1\nout ")
    sink("stderr", b"err s3cret\n")
    sink("stdout", b"2\n")
    transcripts.sink_for("two")("stderr", b"tail without newline")
    run = ExecRun([Outcome(one, "ok", CommandResult(0, "", "", 0.0)),
                   Outcome(two, "ok", CommandResult(3, "", "", 0.0))])
    text = render_text(run, transcripts=transcripts.lines())
    assert text.splitlines() == ["== one exit 0", "out 1", f"err {MASK}", "out 2",
                                 "== two exit 3", "tail without newline"]


def test_exec_masks_secret_vars_in_streamed_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2-not-for-logs"
    target = dataclasses.replace(local_target(), vars={"db_password": secret})
    monkeypatch.setattr(resolve, "resolve_targets", lambda _request: Resolution([target]))
    code, out, err = invoke("exec", "--local", "--", "sh", "-c", 'echo "pw=$0" >&2; echo "$0"', secret)
    assert code == 0, err
    assert err == f"pw={MASK}\n"
    assert out.endswith(f"{secret}\n")  # stdout is the command's data, passed on byte for byte


def test_exec_labels_streamed_stderr_when_there_are_several_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    here = local_target()
    targets = [dataclasses.replace(here, name=name) for name in ("one", "two")]
    monkeypatch.setattr(resolve, "resolve_targets", lambda _request: Resolution(targets))
    code, out, err = invoke("exec", "--local", "--", "sh", "-c", "echo out; printf 'no newline' >&2")
    assert code == 0, err
    assert sorted(err.splitlines()) == ["one ! no newline", "two ! no newline"]  # flushed per target
    assert out == "== one exit 0\nout\n== two exit 0\nout\n"


def test_exec_json_keeps_stderr_in_the_record_only() -> None:
    code, out, err = invoke("exec", "--local", "--json", "--", "sh", "-c", "echo b >&2")
    assert code == 0 and err == ""
    assert '"stderr": "b\\n"' in out


# ---------------------------------------------------------------- 3. --local on exec and apply


def test_exec_local_runs_here() -> None:
    code, out, err = invoke("exec", "--local", "--", "true")
    assert (code, out, err) == (0, "== local exit 0\n", "")


@pytest.mark.parametrize("command", [["exec", "--local"], ["apply", "book.yaml", "--local"],
                                     ["probe", "--local"]])
@pytest.mark.parametrize(("extra", "named"), [(["--host", "127.0.0.1"], "--host"),
                                              (["-i", "inventory.example.yaml"], "-i/--inventory")])
def test_local_with_inventory_or_host_is_a_one_line_usage_error(
    command: list[str], extra: list[str], named: str,
) -> None:
    tail = ["--", "true"] if command[0] == "exec" else []
    code, out, err = invoke(*command, *extra, *tail)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--local cannot be combined with " + named in err, err


def test_apply_local_check_changes_nothing_and_apply_local_does(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    book = tmp_path / "book.yaml"
    book.write_text(TINY_PLAYBOOK.format(marker=marker))
    state = tmp_path / "state"
    code, out, err = invoke("apply", str(book), "--local", "--check", "--state-dir", str(state))
    assert code == 0, err
    assert "would-change local: marker present" in out and "CHECK RECAP tiny" in out
    assert not marker.exists()
    assert len(list((state / "runs").iterdir())) == 1  # --state-dir reached the recorder
    # The same command without --check does change: it was check mode that held it back above.
    code, out, err = invoke("apply", str(book), "--local", "--state-dir", str(state))
    assert code == 0 and marker.exists(), out + err
    assert "PLAY RECAP tiny" in out


# ---------------------------------------------------------------- 4. errors that say what to do next


def _connect_error(tmp_path: Path, raise_from_socket: BaseException | None = None, port: int = 1) -> Any:
    """The ConnectError the real SSH transport raises (sock_factory stands in for the network)."""
    def refuse_or_fail(settings: SSHSettings) -> Any:
        assert raise_from_socket is not None
        raise raise_from_socket

    settings = SSHSettings("127.0.0.1", port, known_hosts=str(tmp_path / "kh"), connect_timeout=2)
    connection = SSHConnection(settings, sock_factory=None if raise_from_socket is None else refuse_or_fail)
    with pytest.raises(ConnectError) as caught:
        connection.open()
    return caught.value


def _host_key_errors(tmp_path: Path) -> tuple[UnknownHostKeyError, ChangedHostKeyError]:
    known = KnownHosts(str(tmp_path / "known_hosts"))
    old, new = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    with pytest.raises(UnknownHostKeyError) as unknown:
        known.verify("127.0.0.1", 2222, new, accept_new=False)
    known.record("[127.0.0.1]:2222", old)
    with pytest.raises(ChangedHostKeyError) as changed:
        known.verify("127.0.0.1", 2222, new, accept_new=False)
    return unknown.value, changed.value


def real_errors(tmp_path: Path, closed_port: int) -> dict[str, FleetfixError]:
    """One error of each kind, made by the code that raises it for real."""
    unknown, changed = _host_key_errors(tmp_path)
    with pytest.raises(AuthenticationError) as auth:
        load_private_key(str(tmp_path / "no-such-key"))
    with pytest.raises(InventoryError) as inventory:
        resolve_inventory_path(str(tmp_path / "inventory.yaml"))
    return {
        "host-key-unknown": unknown,
        "host-key-changed": changed,
        "auth": auth.value,
        "refused": _connect_error(tmp_path, port=closed_port),
        "timeout": _connect_error(tmp_path, TimeoutError()),
        "resolve": _connect_error(tmp_path, socket.gaierror(-2, "Name or service not known")),
        "unreachable": _connect_error(tmp_path, OSError(113, "No route to host")),
        "inventory-missing": inventory.value,
    }


# The class each first-run failure must be raised as: its hint is the next thing to try.
EXPECTED_CLASSES = {
    "host-key-unknown": UnknownHostKeyError,
    "host-key-changed": ChangedHostKeyError,
    "auth": AuthenticationError,
    "refused": ConnectRefusedError,
    "timeout": ConnectTimeoutError,
    "resolve": NameResolutionError,
    "unreachable": ConnectError,
    "inventory-missing": InventoryNotFoundError,
}


def test_every_first_run_failure_ends_with_its_next_step(tmp_path: Path, closed_port: int) -> None:
    errors = real_errors(tmp_path, closed_port)
    assert sorted(errors) == sorted(EXPECTED_CLASSES)
    hints = set()
    for kind, error in errors.items():
        assert type(error) is EXPECTED_CLASSES[kind], (kind, type(error), str(error))
        assert error.hint, kind
        hints.add(error.hint)
        hinted = error.with_hint()
        assert hinted == f"{error} — {error.hint}" and "\n" not in hinted
    assert len(hints) == len(errors)  # each kind its own advice


def test_the_hints_name_the_options_that_fix_them() -> None:
    assert UnknownHostKeyError.hint and "--known-hosts FILE" in UnknownHostKeyError.hint
    assert AuthenticationError.hint and "--identity FILE" in AuthenticationError.hint
    assert "--user" in AuthenticationError.hint
    assert ConnectRefusedError.hint and "--port" in ConnectRefusedError.hint
    assert ConnectTimeoutError.hint and "--connect-timeout" in ConnectTimeoutError.hint
    assert InventoryNotFoundError.hint and "--host" in InventoryNotFoundError.hint


@pytest.mark.parametrize("error", [
    CommandFailedError("command failed (exit 1): nope"),
    ConnectionLostError("127.0.0.1:22: connection lost while running sh"),
    FleetfixError("probe timed out after 30s"),  # a timeout, but not a connection's
    InventoryError("nodes: field required", path="inv.yaml", line=1),
])
def test_other_errors_get_no_hint(error: FleetfixError) -> None:
    assert error.hint is None and error.with_hint() == str(error)


def test_cli_error_line_carries_the_hint(tmp_path: Path) -> None:
    code, _, err = invoke("inventory", "list", "-i", str(tmp_path / "missing.yaml"))
    assert code == 2 and err.count("\n") == 1
    assert InventoryNotFoundError.hint and err.rstrip().endswith(InventoryNotFoundError.hint)


def test_exec_and_probe_print_the_hint_per_target(closed_port: int) -> None:
    host = ["--host", "127.0.0.1", "--port", str(closed_port)]
    code, out, _ = invoke("exec", *host, "--", "true")
    assert code == 4 and f"connection refused — {ConnectRefusedError.hint}" in out
    code, out, _ = invoke("probe", *host)
    assert code == 4 and f"connection refused — {ConnectRefusedError.hint}" in out


# ---------------------------------------------------------------- 5. plain tables off a terminal


def assert_plain(text: str) -> None:
    assert text.strip(), "nothing printed"
    for line in text.split("\n"):
        assert not line.endswith(" "), repr(line)
        assert not [ch for ch in line if ord(ch) < 32 or ord(ch) == 127], repr(line)


def test_tables_piped_have_no_padding_or_control_characters(tmp_path: Path, closed_port: int) -> None:
    inventory = run_fleetfix("inventory", "list", "-i", "inventory.example.yaml")
    assert inventory.returncode == 0 and "TARGET" in inventory.stdout, inventory.stderr
    # two unreachable containers: the per-target blocks, their hints, and the summary table
    probe = run_fleetfix("probe", "--host", "127.0.0.1", "--port", str(closed_port), "--ct", "200",
                         "--ct", "201")
    assert probe.returncode == 4 and "HEALTH" in probe.stdout and "FINDINGS" in probe.stdout
    db = str(tmp_path / "audit.db")
    audit = run_fleetfix("audit", "--db", db, "--host", "127.0.0.1", "--port", str(closed_port))
    assert audit.returncode == 4, audit.stderr
    history = run_fleetfix("audit", "history", "--db", db)
    assert history.returncode == 0 and "UNREACH" in history.stdout
    for result in (inventory, probe, history):
        assert_plain(result.stdout)


def test_runs_table_piped_is_plain(tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(TINY_PLAYBOOK.format(marker=tmp_path / "marker"))
    state = str(tmp_path / "state")
    assert run_fleetfix("apply", str(book), "--local", "--check", "--state-dir", state).returncode == 0
    runs = run_fleetfix("runs", "list", "--state-dir", state)
    assert runs.returncode == 0 and "would-change" in runs.stdout
    assert_plain(runs.stdout)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _table() -> Table:
    table = Table("NAME", "VALUE", box=None, pad_edge=False)
    table.add_row("[bold]x[/]", "a long value")
    table.add_row("y", "[red]s[/]")
    return table


def test_no_color_on_a_terminal_prints_no_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    coloured = _console(file=FakeTTY())
    coloured.print("[bold red]error[/]")
    assert "\x1b[" in coloured.file.getvalue()  # type: ignore[attr-defined]  # the control: a TTY has colour

    monkeypatch.setenv("NO_COLOR", "1")
    plain = _console(file=FakeTTY())
    plain.print("[bold red]error[/]")
    print_table(_table(), plain)
    assert_plain(plain.file.getvalue())  # type: ignore[attr-defined]


def test_print_table_strips_what_rich_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    piped = _console(file=io.StringIO())
    piped.print(_table())
    assert "s           \n" in piped.file.getvalue()  # type: ignore[attr-defined]  # rich alone pads
    piped = _console(file=io.StringIO())
    print_table(_table(), piped)
    assert piped.file.getvalue() == "NAME  VALUE\nx     a long value\ny     s\n"  # type: ignore[attr-defined]
