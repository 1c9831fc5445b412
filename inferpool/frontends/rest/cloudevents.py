"""MLServer's CloudEvents headers on REST inference answers (``cloudevents`` setting).

MLServer 1.7.1 adds binary-mode CloudEvents headers to every inference answer (its
``CloudEventsMiddleware``), and Seldon's request loggers and pipelines read them: the spec
version ``0.3``, a source and an inference service name from the server's name
(``mlserver``) and its Kubernetes namespace, the response type, the model as ``ce-modelid``
and ``ce-endpoint``, and the answer's id as ``ce-id`` and ``ce-requestid``.

All but the id are the same for every answer of a model: each model's lines are built once
(``CloudEvents.lines``), so an answer only appends two formatted lines to its header block.
"""

from __future__ import annotations

import functools
from pathlib import Path

SPEC_VERSION = "0.3"
RESPONSE_TYPE = "io.seldon.serving.inference.response"
# MLServer's default ``server_name``: what Seldon's consumers of these headers expect.
SERVER_NAME = "mlserver"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Models' lines kept (a server with more models rebuilds them: a bound, not a cache policy).
_MAX_MODELS = 4096
_ID_LINES = b"ce-id: %b\r\nce-requestid: %b\r\n"


@functools.cache
def served_namespace() -> str | None:
    """This pod's namespace, read once (``kubernetes_namespace``)."""
    return kubernetes_namespace()


def headers(model: str, answer_id: str | None, namespace: str | None) -> dict[str, str]:
    """The CloudEvents headers of one answer of ``model``, named as MLServer names them
    where they travel inside a response (``parameters.headers`` of a stream's events)."""
    source = f"io.seldon.serving.deployment.{SERVER_NAME}"
    if namespace:
        source = f"{source}.{namespace}"
    found = {
        "Ce-Specversion": SPEC_VERSION,
        "Ce-Source": source,
        "Ce-Type": RESPONSE_TYPE,
        "Ce-Modelid": model,
        "Ce-Inferenceservicename": SERVER_NAME,
        "Ce-Endpoint": model,
    }
    if answer_id:
        found["Ce-Id"] = found["Ce-Requestid"] = answer_id
    if namespace:
        found["Ce-Namespace"] = namespace
    return found


def kubernetes_namespace(path: Path = NAMESPACE_FILE) -> str | None:
    """The pod's namespace, as MLServer reads it, or None outside Kubernetes."""
    try:
        namespace = path.read_text().strip()
    except OSError:
        return None
    return namespace if namespace.isprintable() and namespace else None


class CloudEvents:
    """The ``ce-*`` header lines of a model's inference answers."""

    def __init__(self, namespace: str | None) -> None:
        source = f"io.seldon.serving.deployment.{SERVER_NAME}"
        if namespace:
            source = f"{source}.{namespace}"
        common = (
            f"ce-specversion: {SPEC_VERSION}\r\nce-source: {source}\r\n"
            f"ce-type: {RESPONSE_TYPE}\r\nce-inferenceservicename: {SERVER_NAME}\r\n"
        )
        if namespace:
            common += f"ce-namespace: {namespace}\r\n"
        self._common = common.encode()
        self._models: dict[str, bytes] = {}

    def lines(self, model: str, answer_id: bytes) -> bytes:
        """The header lines of an answer of ``model`` (a served model's name) with the id
        ``answer_id``."""
        constant = self._models.get(model)
        if constant is None:
            if len(self._models) >= _MAX_MODELS:
                self._models.clear()
            encoded = model.encode()
            constant = self._common + b"ce-modelid: %b\r\nce-endpoint: %b\r\n" % (encoded, encoded)
            self._models[model] = constant
        return constant + _ID_LINES % (answer_id, answer_id)
