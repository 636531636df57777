"""Fixtures shared by the unit tests of several packages."""

from tests.lab.tlsca import test_ca, trusted_ca  # noqa: F401  # fixtures: a test CA, trusted by this process
