"""Issue 18, High: a connection is shared only by nodes whose every trust setting agrees.

Before: `SSHSettings.key` was (address, port, user), so a second inventory node with the same address but
its own known_hosts, identity, jump host or become settings silently rode on the first node's connection:
its host key was never checked under its own settings.
"""

from __future__ import annotations

import dataclasses

import pytest

from fleetfix.fleet import Fleet
from fleetfix.target import Become, NodeRef, SSHSettings, Target
from fleetfix.transport.base import Transport
from fleetfix.transport.fake import ANY, FakeTransport


class Recording:
    """A connector that records the settings of every connection it opens; each answers every command."""

    def __init__(self) -> None:
        self.opened: list[SSHSettings] = []

    def __call__(self, settings: SSHSettings) -> FakeTransport:
        self.opened.append(settings)
        return FakeTransport("fake").on(ANY)


BASE = SSHSettings("10.0.0.5", 22, "root", identity_file="/keys/a", known_hosts="/kh/a")
VARIANTS = {
    "identity_file": "/keys/b",
    "known_hosts": "/kh/b",
    "accept_new": True,
    "jump_host": "ops@bastion:2222",
    "become": Become(user="root"),
    "user": "fleetfix",
}


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_nodes_that_differ_in_any_trust_setting_get_their_own_connection(field: str) -> None:
    other = dataclasses.replace(BASE, **{field: VARIANTS[field]})
    targets = [Target("a", NodeRef("a", BASE)), Target("b", NodeRef("b", other))]
    connector = Recording()

    def noop(target: Target, transport: Transport) -> None:
        transport.execute(["true"])

    with Fleet(connect=connector) as fleet:
        assert all(outcome.ok for outcome in fleet.map(targets, noop))
    assert sorted(map(repr, connector.opened)) == sorted(map(repr, (BASE, other)))


def test_timeouts_alone_do_not_split_a_connection() -> None:
    other = dataclasses.replace(BASE, connect_timeout=3.0, keepalive=5.0)
    assert other.key == BASE.key
