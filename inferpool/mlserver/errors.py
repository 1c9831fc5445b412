"""MLServer's errors (``mlserver.errors``): each carries the HTTP status it is answered with.

A custom runtime raises them from ``predict`` (``InferenceError`` for a bad request); the
adapter (``inferpool.mlserver.adapter.runtime``) answers them with that status and the message.
"""

from __future__ import annotations


class MLServerError(Exception):
    def __init__(self, msg: str, status_code: int = 400) -> None:
        super().__init__(msg)
        self.status_code = status_code


class InvalidModelURI(MLServerError):
    def __init__(self, name: str, model_uri: str | None = None) -> None:
        msg = f"Invalid URI specified for model {name}"
        if model_uri:
            msg += f" ({model_uri})"
        super().__init__(msg, 422)


class ModelNotFound(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        where = f"{name} with version {version}" if version is not None else name
        super().__init__(f"Model {where} not found", 404)


class ModelNotReady(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        where = f"{name} with version {version}" if version is not None else name
        super().__init__(f"Model {where} is not ready yet.", 400)


class InferenceError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(msg, 400)


class ModelParametersMissing(MLServerError):
    def __init__(self, model_name: str) -> None:
        super().__init__(f"Parameters missing for model {model_name}", 400)
