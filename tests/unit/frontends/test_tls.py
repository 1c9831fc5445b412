"""``frontends/tls.py``: contexts, refusals, reloads into the live contexts, grpc.aio's
fetcher."""

from __future__ import annotations

import ssl

import pytest

from inferpool.engine.admin import SettingsError
from inferpool.frontends.tls import ALPN_GRPC, ServerTls
from inferpool.settings import ServerSettings
from tests.support.tls import Authority


@pytest.fixture
def ca(tmp_path):
    return Authority(tmp_path / "ca")


def test_a_context_has_the_documented_defaults(ca, tmp_path) -> None:
    issued = ca.issue("server")
    tls = ServerTls(issued.cert, issued.key, ca.path)
    context = tls.context(ALPN_GRPC)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.options & ssl.OP_NO_COMPRESSION
    # Only the client CA is trusted: no system CA came with the context.
    assert [cert["subject"] for cert in context.get_ca_certs()] == [
        ((("commonName", "inferpool test CA"),),)
    ]
    plain = ServerTls(issued.cert, issued.key, None).context(ALPN_GRPC)
    assert plain.verify_mode == ssl.CERT_NONE


def test_settings_name_both_files_or_none(ca) -> None:
    issued = ca.issue("server")
    assert ServerTls.from_settings(ServerSettings()) is None
    with pytest.raises(SettingsError, match="both"):
        ServerTls.from_settings(ServerSettings(tls_key=issued.key))
    with pytest.raises(SettingsError, match="needs --tls-certificate"):
        ServerTls.from_settings(ServerSettings(tls_client_ca=ca.path))


@pytest.mark.parametrize("content", [b"", b"garbage\n"])
def test_an_unusable_client_ca_is_one_sentence(ca, tmp_path, content) -> None:
    issued = ca.issue("server")
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(content)
    with pytest.raises(SettingsError, match=r"client CA .* is not a PEM certificate"):
        ServerTls(issued.cert, issued.key, bundle)


def test_a_mismatched_rotation_keeps_the_old_pair_until_it_matches(ca) -> None:
    first, second = ca.issue("first"), ca.issue("second")
    tls = ServerTls(first.cert, first.key, None)
    tls.context(ALPN_GRPC)
    fetch = tls._grpc_fetch
    assert fetch() is None  # nothing new since the start
    first.cert.write_bytes(second.cert_pem)  # the certificate before its key
    with pytest.raises(SettingsError, match="does not match"):
        tls.reload()
    assert tls.files.certificate == first.cert_pem and tls.generation == 0
    assert fetch() is None
    first.key.write_bytes(second.key_pem)
    tls.reload()
    assert tls.files.certificate == second.cert_pem and tls.generation == 1
    assert fetch() is not None  # C-core's next handshake takes the new pair
    assert fetch() is None  # once
