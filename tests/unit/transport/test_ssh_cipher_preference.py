"""`prefer_aead_ciphers`: AES-GCM first when paramiko offers it, nothing added or lost."""

from __future__ import annotations

import paramiko

from fleetfix.transport.ssh import AEAD_CIPHERS, prefer_aead_ciphers


def test_gcm_moves_to_the_front_and_the_rest_keeps_its_order() -> None:
    available = ("aes128-ctr", "aes256-ctr", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert prefer_aead_ciphers(available) == (
        "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr",
    )


def test_without_gcm_the_order_is_unchanged() -> None:
    assert prefer_aead_ciphers(("aes256-ctr", "aes128-ctr")) == ("aes256-ctr", "aes128-ctr")


def test_the_installed_paramiko_offers_gcm_and_nothing_is_dropped() -> None:
    available = tuple(paramiko.Transport._preferred_ciphers)
    preferred = prefer_aead_ciphers(available)
    assert sorted(preferred) == sorted(available)
    assert preferred[0] == AEAD_CIPHERS[0]  # if paramiko drops GCM, this benchmark-driven choice needs a look
