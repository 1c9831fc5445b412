"""Certificates made for the TLS tests (the ``cryptography`` package): a CA, a server
certificate for 127.0.0.1 and localhost, client certificates; and clients that trust them.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)
_CA_USAGE = dict.fromkeys(
    (
        "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
        "encipher_only", "decipher_only",
    ),
    False,
) | {"digital_signature": True, "key_cert_sign": True, "crl_sign": True}  # fmt: skip


@dataclass
class Issued:
    """A certificate and its key, as PEM bytes, and where they were written."""

    cert_pem: bytes
    key_pem: bytes
    cert: Path
    key: Path
    serial: int


class Authority:
    """A CA that issues server and client certificates into ``folder``."""

    def __init__(self, folder: Path, name: str = "inferpool test CA") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(**_CA_USAGE),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.path = folder / f"{name.replace(' ', '-')}.pem"
        self.path.write_bytes(self.pem)

    def issue(self, name: str, server: bool = True) -> Issued:
        """A certificate for ``name`` (server: for 127.0.0.1 and localhost; else a client's)."""
        import ipaddress

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        cert_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_path.write_bytes(cert_pem)
        key_path.write_bytes(key_pem)
        return Issued(cert_pem, key_pem, cert_path, key_path, serial)


def client_context(ca: Authority, client: Issued | None = None, alpn: str | None = None):
    """An SSL context trusting ``ca``, presenting ``client`` if given."""
    context = ssl.create_default_context(cafile=str(ca.path))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    if alpn:
        context.set_alpn_protocols([alpn])
    return context


def peer_serial(
    host: str, port: int, ca: Authority, client: Issued | None = None, alpn: str | None = None
) -> int:
    """The serial number of the certificate a new TLS connection to ``host:port`` is served."""
    with tls_socket(host, port, client_context(ca, client, alpn)) as tls:
        der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


@contextlib.contextmanager
def tls_socket(host: str, port: int, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    """A TLS client socket to ``host:port``, its handshake done."""
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        yield tls


def wait_ready_https(
    url: str, process: subprocess.Popen, output, verify, cert=None, timeout: float = 60
) -> None:
    """Poll ``url``/v2/health/ready over HTTPS until 200; fail with the server's output."""
    deadline = time.monotonic() + timeout
    with httpx.Client(verify=verify, timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited {process.returncode}:\n{output()}")
            try:
                if client.get(url + "/v2/health/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{output()}")
