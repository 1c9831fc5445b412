"""KServe's V1 protocol as both sides of the process boundary need it: the internal
custom-endpoint names that ``/v1/models/{name}:predict`` and ``:explain`` send a body to,
the reading of a V1 body (``instances``) and KServe's error sentences.

The frontend (``frontends/rest/kserve_v1.py``) names the endpoint; the worker
(``engine/worker/kserve_v1.py``) reads the body with ``instances`` and converts it
(``codecs/kserve_v1.py``). The names hold a ":" so that no URL of a custom endpoint can
reach them.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol import limits
from inferpool.protocol.rest_json import check_depth

PREDICT = ":kserve-v1/predict"
EXPLAIN = ":kserve-v1/explain"
# The members that carry the rows: ``inputs`` is KServe's synonym, and wins when both are
# there (kserve.utils.get_predict_input).
MEMBERS = ("inputs", "instances")


def instances(body: bytes) -> list[Any]:
    """The rows of a V1 body: ``{"instances": [...]}`` or ``{"inputs": [...]}``; a
    ``BadRequest`` in KServe's words for anything else."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Unrecognized request format: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest('Expected a JSON object with "instances" or "inputs"')
    check_depth(document, limits.current().max_json_depth, "the V1 body")
    for member in MEMBERS:
        if member in document:
            rows = document[member]
            if not isinstance(rows, list):
                raise BadRequest(f'Expected "{member}" to be a list')
            if not rows:
                raise BadRequest(f'"{member}" is empty: send at least one instance')
            return rows
    raise BadRequest('Expected "instances" or "inputs" in the request body')


def not_found(name: str) -> str:
    """KServe's 404 sentence (``kserve.errors.ModelNotFound``)."""
    return f"Model with name {name} does not exist."


def not_ready(name: str, detail: str = "") -> str:
    """KServe's 503 sentence (``kserve.errors.ModelNotReady``), with inferpool's reason."""
    sentence = f"Model with name {name} is not ready."
    return f"{sentence} {detail}" if detail else sentence
