"""The one error tree: every error the server reports carries its HTTP status and gRPC code.

Errors cross process boundaries as ``(status, message)`` pairs, never as pickled
exceptions, so ``from_status`` rebuilds the matching class on the other side.
"""

from __future__ import annotations

# gRPC status codes by name, kept as strings so this module does not import grpc.
_GRPC_BY_HTTP = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",  # a custom endpoint asked with a method it does not answer
    409: "ALREADY_EXISTS",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    422: "INVALID_ARGUMENT",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class InferpoolError(Exception):
    """Base error: a message safe to show to a client, and its HTTP status."""

    status: int = 500
    #: the client should come back later: REST adds ``Retry-After``, gRPC
    #: ``grpc-retry-pushback-ms``
    retry_after: bool = False
    #: how long, in whole seconds (at least 1), when ``retry_after`` is set
    retry_seconds: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def grpc_code(self) -> str:
        return grpc_code_for(self.status)


class BadRequest(InferpoolError):
    """A request the server cannot take as sent; the message names the input and the problem."""

    status = 400


class Unauthorized(InferpoolError):
    """An admin call without the admin token."""

    status = 401


class Forbidden(InferpoolError):
    """A call the server's configuration does not allow (e.g. --model-control-mode none)."""

    status = 403


class TooLarge(InferpoolError):
    """A request over a size limit (body, tensor bytes); the message names the limit."""

    status = 413


class ModelNotFound(InferpoolError):
    """An unknown model or version, or one unloaded through the API."""

    status = 404


class NotReady(InferpoolError):
    """The server or the model is not ready (starting, failed, draining)."""

    status = 503


class ModelLoading(NotReady):
    """The model is loading (or reloading after its workers restarted): retry shortly."""

    retry_after = True


class Overloaded(InferpoolError):
    """Every queue that could take the request is full; the client should retry."""

    status = 503
    retry_after = True


class RateLimited(InferpoolError):
    """A request over a rate limit (a model's or an API key's): 429, and when to retry."""

    status = 429
    retry_after = True

    def __init__(self, message: str, retry_seconds: int) -> None:
        super().__init__(message)
        self.retry_seconds = retry_seconds


class WorkerLost(InferpoolError):
    """The worker running (or about to run) the request died or was recycled; retry it."""

    status = 503


class ClientGone(InferpoolError):
    """The client went away before its request ran (nginx's 499; gRPC CANCELLED)."""

    status = 499


class DeadlineExceeded(InferpoolError):
    """The request's deadline or its model's timeout passed."""

    status = 504


class ModelError(InferpoolError):
    """The model itself raised while predicting."""

    status = 500


class ModelLoadError(InferpoolError):
    """A model failed to load; the message says why, naming the file or library."""

    status = 500


class RuntimeNotFound(ModelLoadError):
    """No runtime can serve the model's folder or settings (the message says what to do)."""


_BY_STATUS: dict[int, type[InferpoolError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: ModelNotFound,
    413: TooLarge,
    499: ClientGone,
    500: ModelError,
    503: NotReady,
    504: DeadlineExceeded,
}


# The HTTP status a gRPC status stands for (the usual gRPC-HTTP mapping, grpc-gateway's): a
# gRPC call's outcome as the metrics count it and the tracer records it.
HTTP_OF_GRPC = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400,
    "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500,
    "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401,
}  # fmt: skip


def grpc_code_for(status: int) -> str:
    """The gRPC status code name that matches an HTTP status."""
    return _GRPC_BY_HTTP.get(status, "UNKNOWN" if status >= 400 else "OK")


def from_status(status: int, message: str) -> InferpoolError:
    """Rebuild an error received as ``(status, message)`` from another process."""
    error = _BY_STATUS.get(status, InferpoolError)(message)
    error.status = status
    return error
