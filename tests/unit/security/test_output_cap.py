"""Issue 18, High: remote output is bounded in memory and in records.

Before: `fleetfix exec -- cat /dev/zero` grew the controller to 5.4 GB; a step printing 100 MB made a 200 MB
events.jsonl, after which `runs list` took 8.6 s and 550 MB. Now a command's stdout and stderr each keep
at most `--max-output` bytes (first and last halves, with a marker line saying how much was dropped and
the cap), and a run record keeps at most `--record-output` bytes per string.

Memory is measured, not timed: the child runs under an address-space limit far below what the output
would take, so without the cap it dies with a MemoryError.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetfix.transport.base import CappedOutput, cap_text
from fleetfix.transport.local import LocalTransport

REPO = Path(__file__).resolve().parents[3]


def limited(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def fleetfix(*args: str, env: dict[str, str] | None = None, memory: int = 1 << 30
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetfix", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, preexec_fn=lambda: limited(memory),
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=30), cap=st.integers(min_value=2, max_value=400))
def test_capped_output_keeps_head_and_tail_and_counts_the_rest(chunks: list[bytes], cap: int) -> None:
    capped = CappedOutput(cap)
    for chunk in chunks:
        capped.add(chunk)
    whole = b"".join(chunks)
    kept = capped.getvalue()
    if len(whole) <= cap:
        assert kept == whole and capped.dropped == 0
    else:
        assert capped.dropped == len(whole) - cap
        head, tail = whole[:cap // 2], whole[len(whole) - (cap - cap // 2):]
        assert kept.startswith(head) and kept.endswith(tail)
        assert f"[fleetfix: {capped.dropped} bytes dropped here".encode() in kept


def test_cap_text_leaves_short_text_alone_and_marks_long_text() -> None:
    assert cap_text("short", 100) == "short"
    capped = cap_text("a" * 1000 + "b" * 1000, 100)
    assert capped.startswith("a" * 50) and capped.endswith("b" * 50)
    assert "[fleetfix: 1900 bytes dropped here: output over the 100 B cap]" in capped


def test_local_transport_keeps_only_the_cap() -> None:
    result = LocalTransport(max_output=64 * 1024).execute(["head", "-c", str(20 * 1024 * 1024), "/dev/zero"])
    assert result.ok
    assert result.dropped == 20 * 1024 * 1024 - 64 * 1024
    assert len(result.stdout) < 70 * 1024


def test_exec_of_an_endless_stream_stays_within_memory() -> None:
    """`exec -- cat /dev/zero` (here: 2 GiB of it, so the test ends) under a 1 GiB address-space limit."""
    done = fleetfix("exec", "--local", "--max-output", "1M", "--json", "--",
                    "head", "-c", str(2 * 1024**3), "/dev/zero")
    assert done.returncode == 0, done.stderr[-2000:]
    [result] = json.loads(done.stdout)
    assert result["dropped"] == 2 * 1024**3 - 1024**2
    marker = f"[fleetfix: {result['dropped']} bytes dropped here: output over the 1 MiB cap]"
    assert marker in result["stdout"]


def test_a_step_printing_100_mb_leaves_a_small_record(tmp_path: Path) -> None:
    playbook = tmp_path / "loud.yaml"
    playbook.write_text(yaml.safe_dump({"name": "loud", "steps": [
        {"name": "shout", "check": "head -c 104857600 /dev/zero | tr '\\\\0' x; exit 1", "apply": "true"}]}))
    state = tmp_path / "state"
    done = fleetfix("apply", str(playbook), "--local", "--check", "--state-dir", str(state),
                    "--record-output", "64k")
    assert done.returncode == 0, done.stderr[-2000:]
    [events] = list(state.glob("runs/*/events.jsonl"))
    assert events.stat().st_size < 1024 * 1024
    script_end = next(json.loads(line) for line in events.read_text().splitlines()
                      if json.loads(line)["kind"] == "script-end")
    assert "bytes dropped here: output over the 64 KiB cap]" in script_end["stdout"]
    listed = fleetfix("runs", "list", "--state-dir", str(state), "--json", memory=512 << 20)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["playbook"] == "loud"


@pytest.mark.parametrize("value", ["1", "12q", "2G", "-5"])
def test_max_output_must_be_a_sane_size(value: str) -> None:
    done = fleetfix("exec", "--local", "--max-output", value, "--", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr
