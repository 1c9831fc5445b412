"""The ``parameters.headers`` of each V2 response event of a REST stream, as MLServer
sends them.

MLServer answers ``infer_stream`` / ``generate_stream`` with one Server-Sent Event per
InferenceResponse and leaves the response's headers inside it (they cannot become HTTP
headers once the stream has started): the model's own ``parameters.headers``, updated
with the CloudEvents headers its middleware adds to every response (``Ce-Id``,
``Ce-Specversion``, ``Ce-Source``, ``Ce-Type``, ``Ce-Modelid``,
``Ce-Inferenceservicename``, ``Ce-Endpoint``, ``Ce-Requestid``, ``Ce-Namespace`` in
Kubernetes). Clients written for MLServer read them there; this module adds them the same
way. Flat ``generate`` events (no ``outputs`` list) are Triton's format and left alone.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson

from inferpool.frontends.dataplane import SERVER_NAME

SPEC_VERSION = "0.3"
RESPONSE_TYPE = "io.seldon.serving.inference.response"
# Where Kubernetes mounts the pod's namespace (MLServer reads it there too).
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@functools.cache
def namespace() -> str | None:
    """The pod's Kubernetes namespace, or None outside Kubernetes."""
    try:
        return NAMESPACE_FILE.read_text()
    except OSError:
        return None


def cloudevent_headers(model: str, response_id: str | None) -> dict[str, str]:
    """The CloudEvents headers of one response of ``model``."""
    source = f"io.seldon.serving.deployment.{SERVER_NAME}"
    space = namespace()
    if space:
        source = f"{source}.{space}"
    headers = {
        "Ce-Specversion": SPEC_VERSION,
        "Ce-Source": source,
        "Ce-Type": RESPONSE_TYPE,
        "Ce-Modelid": model,
        "Ce-Inferenceservicename": SERVER_NAME,
        "Ce-Endpoint": model,
    }
    if response_id:
        headers["Ce-Id"] = headers["Ce-Requestid"] = response_id
    if space:
        headers["Ce-Namespace"] = space
    return headers


def with_headers(body: bytes, model: str, request_id: str) -> bytes:
    """A V2 response event's JSON with its ``parameters.headers`` (the module's text);
    any other JSON as it is. ``request_id``: the call's, for a response without ``id``."""
    document: Any = orjson.loads(body)
    if not isinstance(document, dict) or not isinstance(document.get("outputs"), list):
        return body
    parameters = document.get("parameters")
    if not isinstance(parameters, dict):
        parameters = document["parameters"] = {}
    headers = parameters.get("headers")
    if not isinstance(headers, dict):
        headers = parameters["headers"] = {}
    response_id = document.get("id")
    headers.update(cloudevent_headers(model, response_id if response_id else request_id))
    return orjson.dumps(document)
