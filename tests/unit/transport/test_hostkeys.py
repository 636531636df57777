"""known_hosts checking: OpenSSH's formats and fingerprints, and the accept-new / changed-key policy."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from pathlib import Path

import pytest
from paramiko import HostKeys, PKey

from fleetfix.errors import ChangedHostKeyError, HostKeyError, UnknownHostKeyError
from fleetfix.transport import hostkeys
from fleetfix.transport.hostkeys import KnownHosts, fingerprint, known_hosts_name, parse_line


def make_key(path: Path, kind: str = "ed25519") -> tuple[PKey, str]:
    """A host key pair via ssh-keygen; returns the public key and its 'type base64' text."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    key_type, blob = Path(f"{path}.pub").read_text().split()[:2]
    return PKey.from_type_string(key_type, base64.b64decode(blob)), f"{key_type} {blob}"


@pytest.fixture
def key(tmp_path: Path) -> tuple[PKey, str]:
    return make_key(tmp_path / "host_a")


@pytest.fixture
def other_key(tmp_path: Path) -> tuple[PKey, str]:
    return make_key(tmp_path / "host_b")


def test_fingerprint_is_openssh_sha256(tmp_path: Path, key: tuple[PKey, str]) -> None:
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "host_a.pub")],
        capture_output=True, text=True, check=True,
    ).stdout.split()[1]
    assert fingerprint(key[0]) == listed
    assert listed.startswith("SHA256:") and not listed.endswith("=")


def test_names_for_default_and_other_ports() -> None:
    assert known_hosts_name("pve1.lan", 22) == "pve1.lan"
    assert known_hosts_name("127.0.0.2", 2222) == "[127.0.0.2]:2222"


def test_plain_bracketed_entry_is_trusted(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"# comment\n\n[127.0.0.2]:2222 {key[1]}\n")
    KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=False)
    with pytest.raises(UnknownHostKeyError):  # same address, another port: a different host to OpenSSH
        KnownHosts(str(known)).verify("127.0.0.2", 22, key[0], accept_new=False)


def test_hashed_entry_from_ssh_keygen_is_trusted(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.2]:2222 {key[1]}\npve9 {key[1]}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert "127.0.0.2" not in known.read_text()  # really hashed now
    KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=False)
    KnownHosts(str(known)).verify("pve9", 22, key[0], accept_new=False)


def test_wildcards_negation_and_junk_lines(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"garbage\nhost only-two-fields\nx ssh-ed25519 !!notbase64!!\n*.lan,!bad.lan {key[1]}\n")
    KnownHosts(str(known)).verify("pve1.lan", 22, key[0], accept_new=False)
    with pytest.raises(UnknownHostKeyError):
        KnownHosts(str(known)).verify("bad.lan", 22, key[0], accept_new=False)


def test_unknown_key_message_has_fingerprint_and_how_to_trust(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "missing" / "known_hosts"
    with pytest.raises(UnknownHostKeyError) as caught:
        KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=False)
    message = str(caught.value)
    assert "\n" not in message
    assert f"ssh-ed25519 {fingerprint(key[0])}" in message
    assert "--accept-new" in message and f"ssh-keyscan -p 2222 127.0.0.2 >> {known}" in message
    assert not known.exists()  # refusing writes nothing


def test_accept_new_records_like_openssh(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "new-dir" / "known_hosts"
    KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=True)
    assert known.read_text() == f"[127.0.0.2]:2222 {key[1]}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    assert stat.S_IMODE(known.parent.stat().st_mode) == 0o700
    KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=False)  # trusted from now on
    # OpenSSH reads what we wrote, too.
    found = subprocess.run(
        ["ssh-keygen", "-F", "[127.0.0.2]:2222", "-f", str(known)], capture_output=True, text=True
    )
    assert found.returncode == 0 and key[1] in found.stdout


def test_accept_new_appends_after_a_last_line_without_newline(tmp_path: Path, key: tuple[PKey, str],
                                                              other_key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"other {other_key[1]}")  # no trailing newline
    KnownHosts(str(known)).verify("pve1", 22, key[0], accept_new=True)
    assert known.read_text().splitlines() == [f"other {other_key[1]}", f"pve1 {key[1]}"]


def test_changed_key_is_refused_even_with_accept_new(tmp_path: Path, key: tuple[PKey, str],
                                                     other_key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.2]:2222 {other_key[1]}\n")
    before = known.read_text()
    with pytest.raises(ChangedHostKeyError) as caught:
        KnownHosts(str(known)).verify("127.0.0.2", 2222, key[0], accept_new=True)
    message = str(caught.value)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in message and "\n" not in message
    assert fingerprint(key[0]) in message and fingerprint(other_key[0]) in message
    assert known.read_text() == before


def test_revoked_key_is_refused(tmp_path: Path, key: tuple[PKey, str]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {key[1]}\npve1 {key[1]}\n")
    with pytest.raises(ChangedHostKeyError, match="@revoked"):
        KnownHosts(str(known)).verify("pve1", 22, key[0], accept_new=True)


def test_known_key_types_are_asked_for_first(tmp_path: Path) -> None:
    _, ecdsa = make_key(tmp_path / "ec", "ecdsa")
    _, rsa = make_key(tmp_path / "rsa", "rsa")
    known = tmp_path / "known_hosts"
    known.write_text(f"pve1 {ecdsa}\npve1 {rsa}\n")
    offered = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
    assert KnownHosts(str(known)).preferred_algorithms("pve1", 22, offered) == [
        "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256", "ssh-ed25519",
    ]
    assert KnownHosts(str(known)).preferred_algorithms("pve2", 22, offered) == list(offered)


def test_parse_line_markers() -> None:
    entry = parse_line("@cert-authority *.lan ssh-ed25519 AAAA")
    assert entry is not None and entry.marker == "@cert-authority" and entry.patterns == ("*.lan",)
    assert parse_line("   ") is None and parse_line("# x y z") is None


def test_hashed_names_match_exactly_as_paramiko_hashes_them() -> None:
    names = ["pve1", "PVE1", "[127.0.0.2]:2222", "pve7.fleet.test", "node-\u00e9.lan", ""]
    patterns = [HostKeys.hash_host(name) for name in names]
    salt = patterns[0].split("|")[2]
    patterns += [
        patterns[0] + "|",  # a field too many
        patterns[0].replace(salt, salt.rstrip("=")),  # the salt's base64 not canonical
        f"|1|{base64.b64encode(b'short').decode()}|AAAA",  # a salt of the wrong size
        "|1|not base64!|AAAA", "|1|", "|2|x|y",
    ]
    for pattern in patterns:
        for name in names:
            try:
                expected = HostKeys.hash_host(name, pattern) == pattern
            except (AssertionError, ValueError, IndexError):  # paramiko on salts it cannot use
                expected = False
            assert hostkeys._hashed_name_matches(name, pattern) is expected, (name, pattern)


def test_a_fleet_of_lookups_parses_the_file_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: tuple[PKey, str]
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"[127.0.0.{i}]:22{i:02d} {key[1]}\n" for i in range(1, 51)))
    parsed: list[Path] = []
    real = hostkeys.load_known_hosts
    monkeypatch.setattr(hostkeys, "load_known_hosts", lambda path: parsed.append(path) or real(path))
    for i in range(1, 51):  # each node: a connection, a new KnownHosts, two lookups
        known_hosts = KnownHosts(str(known))
        known_hosts.preferred_algorithms(f"127.0.0.{i}", 2200 + i, ("ssh-ed25519",))
        known_hosts.verify(f"127.0.0.{i}", 2200 + i, key[0], accept_new=False)
    assert parsed == [known]
    # accept-new appends a host: the next lookup reads the file again and finds it
    KnownHosts(str(known)).verify("pve-new", 22, key[0], accept_new=True)
    KnownHosts(str(known)).verify("pve-new", 22, key[0], accept_new=False)
    assert parsed == [known, known]  # once more, after the append
    known.write_text(f"[127.0.0.1]:2201 {key[1]}\n")  # rewritten: the other hosts are gone
    with pytest.raises(UnknownHostKeyError):
        KnownHosts(str(known)).verify("127.0.0.2", 2202, key[0], accept_new=False)


def test_indexed_entries_keep_file_order_and_openssh_matching(tmp_path: Path) -> None:
    _, ecdsa = make_key(tmp_path / "ec", "ecdsa")
    _, rsa = make_key(tmp_path / "rsa", "rsa")
    _, ed = make_key(tmp_path / "ed")
    known = tmp_path / "known_hosts"
    # a wildcard line (matched one by one) before plain lines (found by name): file order still decides
    known.write_text(f"*.lan,!other.lan {rsa}\nPVE1.lan {ecdsa}\npve1.lan,pve1.lan {ed}\n")
    offered = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
    assert KnownHosts(str(known)).preferred_algorithms("pve1.lan", 22, offered) == [
        "rsa-sha2-512", "rsa-sha2-256", "ecdsa-sha2-nistp256", "ssh-ed25519",
    ]
    assert [e.key_type for e in KnownHosts(str(known)).entries_for("pve1.LAN", 22)] == [
        "ssh-rsa", "ecdsa-sha2-nistp256", "ssh-ed25519",  # names are not case-sensitive; each line once
    ]
    assert KnownHosts(str(known)).entries_for("other.lan", 22) == []


def test_a_known_hosts_that_cannot_be_read_is_a_host_key_error(tmp_path: Path, key: tuple[PKey, str]
                                                                ) -> None:
    known = tmp_path / "known_hosts"
    known.mkdir()
    with pytest.raises(HostKeyError, match=f"cannot read known_hosts {known}"):
        KnownHosts(str(known)).verify("pve1", 22, key[0], accept_new=False)
    if os.geteuid() != 0:  # root reads a 0000 file anyway
        known.rmdir()
        known.write_text("")
        known.chmod(0)
        with pytest.raises(HostKeyError, match="cannot read known_hosts"):
            KnownHosts(str(known)).verify("pve1", 22, key[0], accept_new=False)
