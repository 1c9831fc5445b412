"""MLServer's CloudEvents header lines (``frontends/rest/cloudevents.py``): in Kubernetes the
source names the namespace and ``ce-namespace`` is added, as MLServer's middleware does."""

from __future__ import annotations

from pathlib import Path

import orjson

from inferpool.frontends.rest.cloudevents import CloudEvents, kubernetes_namespace


def parsed(lines: bytes) -> dict[str, str]:
    pairs = (line.split(": ", 1) for line in lines.decode().split("\r\n") if line)
    return dict(pairs)


def test_inside_kubernetes_the_namespace_is_named(tmp_path: Path) -> None:
    secret = tmp_path / "namespace"
    secret.write_text("models\n")
    namespace = kubernetes_namespace(secret)
    assert namespace == "models"
    headers = parsed(CloudEvents(namespace).lines("iris", b"abc"))
    assert headers["ce-source"] == "io.seldon.serving.deployment.mlserver.models"
    assert headers["ce-namespace"] == "models"
    assert (headers["ce-id"], headers["ce-requestid"], headers["ce-modelid"]) == (
        "abc",
        "abc",
        "iris",
    )


def test_outside_kubernetes_no_namespace(tmp_path: Path) -> None:
    assert kubernetes_namespace(tmp_path / "missing") is None
    headers = parsed(CloudEvents(None).lines("iris", b"x"))
    assert headers["ce-source"] == "io.seldon.serving.deployment.mlserver"
    assert "ce-namespace" not in headers
    # Each model its own constant lines, each answer its own id.
    other = parsed(CloudEvents(None).lines("wine", b"y"))
    assert (other["ce-endpoint"], other["ce-id"]) == ("wine", "y")


def test_a_stream_event_carries_the_headers_inside_its_parameters() -> None:
    from inferpool.frontends.rest.stream_headers import with_headers

    event = b'{"id":"r1","outputs":[],"parameters":{"headers":{"x-own":"1"}}}'
    document = orjson.loads(with_headers(event, "iris", "call-id"))
    headers = document["parameters"]["headers"]
    assert headers["x-own"] == "1"  # the model's own headers are kept
    assert (headers["Ce-Id"], headers["Ce-Requestid"]) == ("r1", "r1")
    assert headers["Ce-Modelid"] == headers["Ce-Endpoint"] == "iris"
    assert headers["Ce-Specversion"] == "0.3"
    # No id of its own: the call's; no parameters: created.
    bare = orjson.loads(with_headers(b'{"outputs":[{"name":"o"}]}', "iris", "call-id"))
    assert bare["parameters"]["headers"]["Ce-Id"] == "call-id"
    # Triton's flat generate events and anything not an object are left as they are.
    for other in (b'{"text_output":"hi"}', b"[1,2]"):
        assert with_headers(other, "iris", "call-id") == other
