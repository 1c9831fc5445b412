"""MLServer's CloudEvents header lines (``frontends/rest/cloudevents.py``): in Kubernetes the
source names the namespace and ``ce-namespace`` is added, as MLServer's middleware does."""

from __future__ import annotations

from pathlib import Path

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
