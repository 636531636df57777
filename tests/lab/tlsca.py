"""A throwaway certificate authority for loopback HTTPS stand-ins: a CA, and a server certificate it signed
for 127.0.0.1 and localhost. The controller is told to trust the CA the way an operator trusts an internal
one, with `SSL_CERT_FILE` (OpenSSL's default verify paths, which Python's default context loads); no
test-only switch in fleetfix. Keys are generated per instance and never leave the test's directory.
`trusted_ca` is the fixture for tests in this process (import it by name).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, issuer: x509.Name,
                 public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))


_CA_USAGE = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False)


class TestCA:
    __test__ = False  # not a pytest class

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (_certificate("fleetfix test CA", _name("fleetfix test CA"), ca_key.public_key())
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(_CA_USAGE, critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        server = (_certificate("127.0.0.1", ca.subject, key.public_key())
                  .add_extension(x509.SubjectAlternativeName(names), critical=False)
                  .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                  .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                 critical=False)
                  .sign(ca_key, hashes.SHA256()))
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self._cert = directory / "server.pem"
        self._cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        self._key = directory / "server.key"
        self._key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
        self._key.chmod(0o600)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._cert, self._key)
        return context

    def env(self) -> dict[str, str]:
        """What a child process needs to trust this CA (and only it) by default."""
        return {"SSL_CERT_FILE": str(self.ca_file)}


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("test-ca"))


@pytest.fixture
def trusted_ca(test_ca: TestCA, monkeypatch: pytest.MonkeyPatch) -> TestCA:
    """test_ca, trusted by this process's default TLS context (and only it) for the test."""
    monkeypatch.setenv("SSL_CERT_FILE", str(test_ca.ca_file))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return test_ca
