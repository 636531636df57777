"""Issue 18, Medium: control sequences from targets never reach the operator's terminal, and the JUnit
XML stays well-formed.

Before: OSC 52 (clipboard write), window titles and cursor movement from a target reached the terminal
through apply output, `runs show`, exec stderr and -v; the JUnit XML was not well-formed when output held
control characters. Every byte from a target now passes `fleetfix.terminal.safe`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetfix.terminal import safe, safe_line

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit" / "audit"))

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # "write `rm -rf ~` to the clipboard"
TITLE = "\x1b]0;pwned\x07"
CURSOR = "\x1b[2A\x1b[2K"  # up two lines, erase: rewrites what was printed
HOSTILE = f"before{OSC52}{TITLE}{CURSOR}\r\x9b31m\u202eevil\x00after"
UNSAFE = set("\x1b\x07\r\x9b\u202e\x00")


def fleetfix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "NO_COLOR": "1"})


def test_safe_escapes_visibly_and_keeps_ordinary_text() -> None:
    shown = safe(HOSTILE)
    assert not UNSAFE & set(shown)
    assert shown.startswith("before\\x1b]52;c;cm0gLXJmIH4=\\x07")
    assert "\\r" in shown and "\\x9b31m" in shown and "\\u202eevil" in shown and "\\x00after" in shown
    assert safe("ünï ✓\ttab\nline") == "ünï ✓\ttab\nline"
    assert "\n" not in safe_line("a\nb")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_nothing_unsafe_survives(text: str) -> None:
    shown = safe(text)
    assert all(c in "\t\n" or (c.isprintable() or c == " ") or ord(c) >= 0xa0 for c in shown)
    assert not {c for c in shown if ord(c) < 0x20 and c not in "\t\n"}
    assert safe(shown) == shown  # idempotent: escaping twice shows the same


def hostile_playbook(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.yaml"
    escaped = HOSTILE.replace("\x00", "").encode("unicode_escape").decode().replace("'", "")
    printf = f"printf '{escaped}\\n'"
    path.write_text(yaml.safe_dump({"name": "hostile", "steps": [
        {"name": "loud", "check": f"{printf}; {printf} >&2; exit 1", "apply": "true"}]}))
    return path


def test_apply_runs_show_and_verbose_output_are_escaped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    playbook = hostile_playbook(tmp_path)
    for args in (["apply"], ["-v", "apply"]):
        done = fleetfix(*args, str(playbook), "--local", "--check", "--state-dir", str(state))
        assert done.returncode == 0, done.stderr
        assert not UNSAFE & set(done.stdout + done.stderr), (done.stdout + done.stderr)[-500:]
    run_id = next((state / "runs").iterdir()).name
    shown = fleetfix("runs", "show", run_id, "--state-dir", str(state))
    assert "\\x1b]52;c;" in shown.stdout
    assert not UNSAFE & set(shown.stdout + shown.stderr)


def test_exec_stderr_is_escaped_live() -> None:
    done = fleetfix("exec", "--local", "--", "sh", "-c", f"printf '%s' '{OSC52}{CURSOR}' >&2")
    assert done.returncode == 0
    assert "\\x1b]52;c;" in done.stderr and not UNSAFE & set(done.stderr)


def test_exec_stdout_stays_raw_when_piped() -> None:
    """Piped (not a terminal), exec's stdout is the command's, byte for byte: `fleetfix exec ... > file`."""
    done = fleetfix("exec", "--local", "--", "printf", "%s", OSC52)
    assert OSC52 in done.stdout


@pytest.fixture
def hostile_audit(tmp_path: Path):  # type: ignore[no-untyped-def]
    from audit_testkit import FakeWorld, make_target

    from fleetfix.audit import DEFAULT_POLICY, AuditStore, run_audit
    from fleetfix.audit.model import TargetResult

    world = FakeWorld({200: "problem_case"})
    with AuditStore(tmp_path / "a.db") as store, world.fleet() as fleet:
        run = run_audit(fleet, [make_target("pve1", 200)], policy=DEFAULT_POLICY, store=store)
    hostile = TargetResult("pve9/9", "pve9", 9, "failed", error=HOSTILE)
    return type(run)(type(run.run)(run.info, (*run.targets, hostile)), run.drift)


def test_junit_and_html_carry_no_control_characters(hostile_audit) -> None:  # type: ignore[no-untyped-def]
    from fleetfix.audit.report import html_report, junit_report

    xml = junit_report(hostile_audit)
    ET.fromstring(xml.split("\n", 1)[1])  # well-formed
    assert "\\x1b]52;c;" in xml
    page = html_report(hostile_audit)
    assert not UNSAFE & set(page) and "\\x1b]52;c;" in page


def hostile_cache(root: Path) -> None:
    """A wheel cache whose one entry carries what a target controls: the key's values (rendered from its
    facts), and a target name (a discovered guest's is its hostname) as the builder; the source is a URL
    whose bytes the controller did not choose."""
    from fleetfix.wheels.cache import Provenance, WheelCache, target_builder
    from tests.lab.releases import make_wheel
    from tests.unit.test_wheel_contents import elf

    cache = WheelCache(root)
    tag = "cp312-cp312-linux_x86_64"
    wheel = cache.incoming(f"causal_conv1d-1.6.1-{tag}.whl")
    wheel.write_bytes(make_wheel("causal_conv1d", "1.6.1", tag, {"causal_conv1d_cuda.so": elf()}))
    key = {"name": "causal-conv1d", "version": "1.6.1", "python_tag": "cp312", "torch": f"2.8.0{OSC52}",
           "torch_cuda": f"12.8{CURSOR}", "cxx11_abi": "1", "machine": "x86_64", "libc": TITLE}
    cache.store(key, wheel, Provenance(target_builder(f"pve1/200{OSC52}"), f"https://h/x\r{TITLE}", 1.0))


def test_wheels_list_verify_and_purge_escape_what_targets_said(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hostile_cache(cache)
    listed = fleetfix("wheels", "list", "--wheel-cache", str(cache))
    assert listed.returncode == 0, listed.stderr
    assert "\\x1b]52;c;" in listed.stdout and "torch_cuda=12.8\\x1b[2A" in listed.stdout
    assert not UNSAFE & set(listed.stdout + listed.stderr), listed.stdout
    for args in (["verify"], ["purge", "--all"]):
        done = fleetfix("wheels", *args, "--wheel-cache", str(cache))
        assert not UNSAFE & set(done.stdout + done.stderr), done.stdout
    # JSON stays JSON: json.dumps escapes every control character itself
    hostile_cache(cache)
    as_json = fleetfix("wheels", "list", "--wheel-cache", str(cache), "--json")
    assert "\\u001b]52;c;" in as_json.stdout and not UNSAFE & set(as_json.stdout)
