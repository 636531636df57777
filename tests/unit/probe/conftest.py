"""Fixtures for the probe tests; the helpers live in probe_testkit."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_testkit import FakeBin


@pytest.fixture
def fakebin(tmp_path: Path) -> FakeBin:
    return FakeBin(tmp_path / "bin")


@pytest.fixture
def fakeroot(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc/apt/sources.list.d").mkdir(parents=True)
    return root
