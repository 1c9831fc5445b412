"""TLS on the REST and gRPC ports: the server's certificate, its key, the client CA.

``ServerTls.from_settings`` reads the files once at start-up and refuses them in one
sentence (``SettingsError``: missing, unreadable, not PEM, a key that does not match the
certificate). Each listener gets its own ``ssl.SSLContext`` (``context``: the ALPN list
differs: ``h2`` for gRPC, ``http/1.1`` for Uvicorn, both for Hypercorn), and grpc.aio a
``grpc.dynamic_ssl_server_credentials`` whose fetcher hands over the newest files.

Defaults: TLS 1.2 at least, Python's default cipher list for a server context (``ssl``'s
``_DEFAULT_CIPHERS``: ECDHE/DHE with AES-GCM, ChaCha20 or AES, no SHA-1, no RC4/3DES, at
OpenSSL security level 2), compression off. With a client CA, a client must present a
certificate it signed (CERT_REQUIRED); the system's CAs are never trusted for clients.

Rotation: ``reload`` (run by ``file_poll`` when a file changes) reads the three files
once, into anonymous memory files, proves them in a fresh context, then loads them into
every live context with ``load_cert_chain`` on the same object: a handshake after that
gets the new certificate, a connection already open keeps its own (OpenSSL copies the
certificate into each connection when it starts). A new client CA is added to the trusted
ones (OpenSSL's store cannot forget one: removing a CA takes a restart).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferpool.engine.admin import SettingsError
from inferpool.settings import ServerSettings

ALPN_GRPC = ["h2"]
ALPN_HTTP1 = ["http/1.1"]
ALPN_HTTP2 = ["h2", "http/1.1"]


@dataclass(frozen=True)
class TlsFiles:
    """The PEM bytes of one state of the files."""

    certificate: bytes
    key: bytes
    client_ca: bytes | None


class ServerTls:
    """The server's TLS material and every context serving it."""

    def __init__(self, certificate: Path, key: Path, client_ca: Path | None) -> None:
        self.certificate, self.key, self.client_ca = certificate, key, client_ca
        self.contexts: list[ssl.SSLContext] = []
        self.files = self._proven()
        self.generation = 0  # counts the reloads; grpc.aio's fetcher compares it
        self._fetched = 0

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ServerTls | None:
        """None without a certificate; SettingsError (one sentence) for unusable files."""
        certificate, key = settings.tls_certificate, settings.tls_key
        if certificate is None and key is None:
            if settings.tls_client_ca is not None:
                raise SettingsError("--tls-client-ca needs --tls-certificate and --tls-key")
            return None
        if certificate is None or key is None:
            raise SettingsError("give both --tls-certificate and --tls-key")
        return cls(Path(certificate), Path(key), settings.tls_client_ca)

    @property
    def paths(self) -> list[Path]:
        return [self.certificate, self.key] + ([self.client_ca] if self.client_ca else [])

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def context(self, alpn: list[str]) -> ssl.SSLContext:
        """A new server context with the current files, followed by every reload."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no system CA loaded
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION
        context.set_alpn_protocols(alpn)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        _load(context, self.files)
        self.contexts.append(context)
        return context

    def reload(self) -> None:
        """Read the files again and serve them to new handshakes (SettingsError: kept the
        old ones)."""
        files = self._proven()
        for context in self.contexts:
            _load(context, files)
        self.files = files
        self.generation += 1

    def _proven(self) -> TlsFiles:
        """The files' bytes, loaded once into a scratch context to prove them usable."""
        files = TlsFiles(
            _read(self.certificate, "certificate"),
            _read(self.key, "key"),
            _read(self.client_ca, "client CA") if self.client_ca else None,
        )
        try:
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files)
        except _BadClientCa as exc:
            raise SettingsError(
                f"the TLS client CA {self.client_ca} is not a PEM certificate ({exc})"
            ) from None
        except ssl.SSLError as exc:
            raise SettingsError(self._refusal(exc)) from None
        return files

    def _refusal(self, exc: ssl.SSLError) -> str:
        reason = exc.reason or exc.strerror or str(exc)
        if reason == "KEY_VALUES_MISMATCH":
            return f"the TLS key {self.key} does not match the certificate {self.certificate}"
        return (
            f"the TLS certificate {self.certificate} and key {self.key} are not a PEM "
            f"certificate chain and its unencrypted private key ({reason})"
        )

    # -- grpc.aio -------------------------------------------------------------------------
    def grpc_credentials(self) -> Any:
        """grpc.aio's server credentials: the current files, then each reload's, fetched by
        C-core at the next handshake."""
        import grpc

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_configuration(),
            self._grpc_fetch,
            require_client_authentication=self.mutual,
        )

    def _grpc_configuration(self) -> Any:
        import grpc

        files = self.files
        return grpc.ssl_server_certificate_configuration(
            [(files.key, files.certificate)], root_certificates=files.client_ca
        )

    def _grpc_fetch(self) -> Any:
        """Called by C-core before each handshake: a new configuration after a reload,
        else None (keep the current one)."""
        generation = self.generation
        if generation == self._fetched:
            return None
        self._fetched = generation
        return self._grpc_configuration()


class _BadClientCa(Exception):
    """The client CA bundle holds no usable certificate (the message says why)."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None


def _load(context: ssl.SSLContext, files: TlsFiles) -> None:
    """Load ``files`` into ``context``: the chain and key through anonymous memory files
    (``load_cert_chain`` reads only paths; the same bytes then go to every context)."""
    with _memory_file(files.certificate) as certificate, _memory_file(files.key) as key:
        context.load_cert_chain(certificate, key)
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cadata=files.client_ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:  # ValueError: an empty file
            reason = getattr(exc, "reason", None) or str(exc)
            raise _BadClientCa(reason) from None


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    fd = os.memfd_create("inferpool-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def alpn_of(transport: Any) -> str | None:
    """The protocol a TLS connection agreed on by ALPN (None: none, or not TLS)."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return ssl_object.selected_alpn_protocol() if ssl_object is not None else None
