"""Fixtures for the discovery tests; the fakes themselves are in pvefakes.py."""

from __future__ import annotations

import pytest
from pvefakes import SECRET, SECRET_ENV


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """The test token secret, in the environment variable the fake sources read."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return SECRET
