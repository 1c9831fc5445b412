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

from typing import Any

import orjson

from inferpool.frontends.rest.cloudevents import headers as cloudevent_headers
from inferpool.frontends.rest.cloudevents import served_namespace


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
    answer_id = response_id if response_id else request_id
    headers.update(cloudevent_headers(model, answer_id, served_namespace()))
    return orjson.dumps(document)
