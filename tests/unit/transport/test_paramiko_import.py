"""fleetfix loads paramiko without invoke (start-up time, docs/performance.md) and leaves invoke usable."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

# paramiko requires invoke from 4.0 on; with an older paramiko (scripts/check-deps.sh --lowest) it may be
# absent, and there is nothing to hide.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("invoke") is None, reason="invoke not installed")

CHECK = """
import sys
import fleetfix.transport.ssh
print("invoke" in sys.modules)
import invoke
print(invoke.__name__)
import paramiko.config
print(paramiko.config.invoke is None)
"""


def test_paramiko_is_imported_without_invoke_and_invoke_stays_importable() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "invoke", "True"]


def test_an_invoke_loaded_before_is_left_to_paramiko() -> None:
    code = "import invoke\n" + CHECK.replace('print("invoke" in sys.modules)', "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["invoke", "False"]
