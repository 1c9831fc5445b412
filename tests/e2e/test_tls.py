"""TLS on the REST and gRPC ports (``frontends/tls.py``), every implementation: Uvicorn and
the builtin gRPC layer, Hypercorn (``--http2``) and grpc.aio. Certificates are made here
(``tests/support/tls.py``); the clients are httpx, tritonclient (http and grpc) and grpcio.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request
from tests.support.stream_calls import Conversation
from tests.support.tls import (
    Authority,
    client_context,
    peer_serial,
    tls_socket,
    wait_ready_https,
)

ROW = [[5.1, 3.5, 1.4, 0.2]]
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": ROW[0]}]}
# (REST server flags, gRPC implementation): every frontend is covered once.
SETUPS = {
    "uvicorn+builtin": (),
    "hypercorn+grpcio": ("--http2", "--grpc-implementation", "grpcio"),
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca = Authority(folder / "ca")
    other = Authority(folder / "other", name="another CA")
    return {
        "ca": ca,
        "server": ca.issue("server"),
        "client": ca.issue("client", server=False),
        "stranger": other.issue("stranger", server=False),
        "folder": folder,
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return build_iris_repository(tmp_path_factory.mktemp("tls") / "repo")


def _start(repository: Path, cert: Path, key: Path, *flags: str) -> Server:
    return Server(
        repository, "--workers", "1", "--tls-certificate", str(cert), "--tls-key", str(key),
        *flags,
    )  # fmt: skip


def _https(server: Server) -> str:
    return server.url.replace("http://", "https://")


def _grpc_credentials(pki, client=None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )


def _grpc_infer(address: str, credentials: grpc.ChannelCredentials) -> pb.ModelInferResponse:
    with grpc.secure_channel(address, credentials) as channel:
        stub = GRPCInferenceServiceStub(channel)
        return stub.ModelInfer(infer_request("iris-logreg", x=np.array(ROW)), timeout=30)


@pytest.fixture(scope="module", params=list(SETUPS))
def tls_server(request, pki, repository, tmp_path_factory):
    # Files of its own: the rotation test rewrites them.
    folder = tmp_path_factory.mktemp("served")
    cert, key = folder / "server.crt", folder / "server.key"
    cert.write_bytes(pki["server"].cert_pem)
    key.write_bytes(pki["server"].key_pem)
    with _start(repository, cert, key, *SETUPS[request.param]) as server:
        wait_ready_https(_https(server), server.process, server.output, client_context(pki["ca"]))
        server.files = (cert, key)
        server.setup = request.param
        yield server


# geventhttpclient (tritonclient.http's) checks the name with the deprecated helper.
@pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning")
def test_inference_over_tls_with_every_client(tls_server, pki):
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    ca = pki["ca"]
    http2 = tls_server.setup.startswith("hypercorn")
    with httpx.Client(verify=client_context(ca), http2=http2) as client:
        reply = client.post(_https(tls_server) + "/v2/models/iris-logreg/infer", json=BODY)
    assert reply.status_code == 200, reply.text
    assert reply.http_version == ("HTTP/2" if http2 else "HTTP/1.1")  # ALPN chose it
    assert reply.json()["outputs"][0]["data"] == [0]

    rest = triton_http.InferenceServerClient(
        f"127.0.0.1:{tls_server.http_port}", ssl=True,
        ssl_context_factory=lambda: client_context(ca), insecure=False,
    )  # fmt: skip
    tensor = triton_http.InferInput("x", [1, 4], "FP64")
    tensor.set_data_from_numpy(np.array(ROW))
    assert rest.infer("iris-logreg", [tensor]).as_numpy("predict").tolist() == [0]
    rest.close()

    remote = triton_grpc.InferenceServerClient(
        tls_server.grpc_address, ssl=True, root_certificates=str(ca.path)
    )
    tensor = triton_grpc.InferInput("x", [1, 4], "FP64")
    tensor.set_data_from_numpy(np.array(ROW))
    assert remote.infer("iris-logreg", [tensor]).as_numpy("predict").tolist() == [0]
    assert remote.is_server_ready()
    remote.close()

    response = _grpc_infer(tls_server.grpc_address, _grpc_credentials(pki))
    assert response.model_name == "iris-logreg"

    # The metrics port stays plain HTTP (an internal port for the scraper).
    metrics = httpx.get(f"http://127.0.0.1:{tls_server.metrics_port}/metrics", timeout=10)
    assert metrics.status_code == 200


def test_plain_clients_fail_cleanly_and_others_go_on(tls_server, pki):
    ca = pki["ca"]
    with httpx.Client(verify=client_context(ca)) as good:
        assert good.get(_https(tls_server) + "/v2/health/ready").status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(tls_server.url + "/v2/health/ready", timeout=5)  # http:// to TLS
        with (
            grpc.insecure_channel(tls_server.grpc_address) as channel,
            pytest.raises(grpc.RpcError) as failed,
        ):
            GRPCInferenceServiceStub(channel).ServerReady(pb.ServerReadyRequest(), timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        # The same client on its open connection, and new ones, are still served.
        assert good.post(_https(tls_server) + "/v2/models/iris-logreg/infer", json=BODY).is_success
    assert _grpc_infer(tls_server.grpc_address, _grpc_credentials(pki)).model_name == "iris-logreg"
    assert "Traceback" not in tls_server.output()


def test_builtin_grpc_requires_alpn_h2(tls_server, pki):
    if not tls_server.setup.endswith("builtin"):
        pytest.skip("grpc.aio's C-core negotiates ALPN itself")
    context = client_context(pki["ca"], alpn="http/1.1")
    with tls_socket("127.0.0.1", tls_server.grpc_port, context) as tls:
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        try:
            data = tls.recv(1024)
        except (ssl.SSLError, ConnectionResetError):
            data = b""
    assert data == b""  # closed without a byte of HTTP/2


def _rotate(pki, files: tuple[Path, Path], name: str):
    """A new certificate from the same CA, written over the served files (key first: the
    poll sees a mismatched pair for a moment and must keep serving the old one)."""
    fresh = pki["ca"].issue(name)
    cert, key = files
    for path, data in ((key, fresh.key_pem), (cert, fresh.cert_pem)):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return fresh


def _served_serial(port: int, pki, alpn: str | None = None) -> int:
    return peer_serial("127.0.0.1", port, pki["ca"], alpn=alpn)


def test_rotated_certificate_reaches_new_connections_only(tls_server, pki, request):
    ca = pki["ca"]
    before = _served_serial(tls_server.http_port, pki)
    # Open connections: a keep-alive REST client and a gRPC stream, each used once.
    keep_alive = httpx.Client(verify=client_context(ca))
    url = _https(tls_server) + "/v2/models/iris-logreg/infer"
    assert keep_alive.post(url, json=BODY).is_success
    channel = grpc.secure_channel(tls_server.grpc_address, _grpc_credentials(pki))
    stream = Conversation("", pb.ModelStreamInferResponse, channel=channel)
    stream.send(infer_request("iris-logreg", x=np.array(ROW)))
    assert not stream.receive().error_message
    try:
        fresh = _rotate(pki, tls_server.files, f"rotated-{request.node.callspec.id}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rest = _served_serial(tls_server.http_port, pki)
            grpc_serial = _served_serial(tls_server.grpc_port, pki, alpn="h2")
            if rest == grpc_serial == fresh.serial:
                break
            time.sleep(0.2)
        assert (rest, grpc_serial) == (fresh.serial, fresh.serial), tls_server.output()[-2000:]
        assert before != fresh.serial
        # The connections opened before go on, with the certificate they started with.
        assert keep_alive.post(url, json=BODY).is_success
        stream.send(infer_request("iris-logreg", x=np.array(ROW)))
        assert not stream.receive().error_message
        assert stream.close() == []
        assert _grpc_infer(tls_server.grpc_address, _grpc_credentials(pki)).model_name
    finally:
        keep_alive.close()
    tls_server.expect_lines([r"the TLS certificate reloaded"])
    assert "Traceback" not in tls_server.output()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_mutual_tls_needs_a_client_certificate_of_its_ca(setup, pki, repository):
    ca, client, stranger = pki["ca"], pki["client"], pki["stranger"]
    server_cert = pki["server"]
    flags = ("--tls-client-ca", str(ca.path), *SETUPS[setup])
    with _start(repository, server_cert.cert, server_cert.key, *flags) as server:
        verify = client_context(ca, client)
        wait_ready_https(_https(server), server.process, server.output, verify)
        url = _https(server) + "/v2/models/iris-logreg/infer"
        assert httpx.post(url, json=BODY, verify=verify).status_code == 200
        assert _grpc_infer(server.grpc_address, _grpc_credentials(pki, client)).model_name
        for who in (None, stranger):  # no certificate; one signed by another CA
            with pytest.raises(httpx.HTTPError):
                httpx.post(url, json=BODY, verify=client_context(ca, who), timeout=10)
            with pytest.raises(grpc.RpcError) as refused:
                _grpc_infer(server.grpc_address, _grpc_credentials(pki, who))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # Those refused did not disturb the others.
        assert httpx.post(url, json=BODY, verify=verify).status_code == 200
        assert peer_serial("127.0.0.1", server.http_port, ca, client) == server_cert.serial
        assert "Traceback" not in server.output()


def _refusal(repository: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "inferpool", "serve", str(repository), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_unusable_files_are_refused_in_one_sentence(pki, repository, tmp_path):
    server, client = pki["server"], pki["client"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = {
        "cannot read the TLS certificate": ("--tls-certificate", str(tmp_path / "missing.crt"),
                                            "--tls-key", str(server.key)),
        "does not match the certificate": ("--tls-certificate", str(server.cert),
                                           "--tls-key", str(client.key)),
        "are not a PEM certificate chain": ("--tls-certificate", str(garbage),
                                            "--tls-key", str(server.key)),
        "is not a PEM certificate": ("--tls-certificate", str(server.cert), "--tls-key",
                                     str(server.key), "--tls-client-ca", str(garbage)),
        "give both --tls-certificate and --tls-key": ("--tls-certificate", str(server.cert)),
    }  # fmt: skip
    for expected, flags in cases.items():
        done = _refusal(repository, *flags)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], done.stderr
        assert "Traceback" not in done.stderr
