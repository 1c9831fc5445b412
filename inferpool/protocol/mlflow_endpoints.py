"""MLflow's scoring protocol as both sides of the process boundary need it: the
custom-endpoint names that the root ``/invocations`` route sends a body to, and the reading
of a JSON scoring body (``scoring_document``).

The names are shared by the frontend (``frontends/rest/mlflow_scoring.py``, which picks one from
the Content-Type) and the worker, so that the frontend process need not import the codecs
to name them. The body is read by the scoring codec (``codecs/mlflow_scoring.py``) and by
the MLflow runtime's own endpoint, with the same checks and the same errors.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol import limits
from inferpool.protocol.rest_json import check_depth

# An MLflow pyfunc's own endpoint answers JSON (with ``params``); every other case is the
# scoring codec's.
INVOCATIONS = "invocations"
INVOCATIONS_CSV = "invocations/csv"  # "/" never comes from the REST custom-endpoint route

# MLflow's scoring formats (``scoring_server.SUPPORTED_FORMATS``), sorted for the messages.
FORMATS = ("dataframe_records", "dataframe_split", "inputs", "instances")


def scoring_document(body: bytes) -> tuple[str, Any, dict[str, Any] | None]:
    """The format, its value and the optional ``params`` of MLflow's JSON scoring body:
    a JSON object (no deeper than the JSON depth limit, since MLflow walks it recursively)
    with exactly one of ``FORMATS``; anything else is a ``BadRequest`` naming the problem."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invocations: the body is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise BadRequest(f"invocations: expected a JSON object with one of {', '.join(FORMATS)}")
    check_depth(document, limits.current().max_json_depth, "invocations: the body")
    present = [key for key in FORMATS if key in document]
    if len(present) != 1:
        raise BadRequest(
            f"invocations: expected exactly one of {', '.join(FORMATS)}, got "
            f"{', '.join(present) or 'none'}"
        )
    params = document.get("params")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("invocations: 'params' must be a JSON object")
    (key,) = present
    return key, document[key], params
