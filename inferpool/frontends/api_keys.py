"""API keys that inference calls must carry (``--api-keys-file``), on REST and gRPC.

The file: one key per line, optionally followed by the names of the models it is limited
to, by ``label=NAME`` (what the access log may say of the key; default ``line N``) and by
``rate=R`` (requests per second its calls naming a model may make, ``burst=B`` at once:
a token bucket, ``engine/rate_limits.py``; past it 429 with Retry-After); ``#`` starts a
comment, blank lines are skipped. A key is printable ASCII without spaces or ``#``::

    # CI's key, any model
    3f9c1e0d8b7a4c2e9d1f0a6b5c4d3e2f  label=ci
    # the fraud team's key: only these two models, 50 requests/s, 100 at once
    a81b72c63d54e45f36a27b18c09d0e1f  fraud-xgb fraud-rules  label=fraud rate=50 burst=100

A call presents its key as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY`` (gRPC:
the same metadata). Open to all: the health probes (REST ``/v2/health/*`` and model
``/ready``, gRPC ServerLive, ServerReady, ModelReady, grpc.health.v1), ``/metrics``,
MLflow's ``/ping`` and ``/health``. The repository's load and unload answer to the admin
token when one is set (``engine/admin.py``), else to an unlimited key.

The check: the presented key is hashed (BLAKE2b keyed by a random per-process salt) and
looked up in a dict of the hashes of every key; nothing compares the key itself, so the
time taken does not depend on which key or how much of one a guess got right, and no key
is kept in memory in the clear. Keys never reach a log or an error message.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inferpool.engine.admin import SettingsError
from inferpool.engine.rate_limits import TokenBucket
from inferpool.errors import Forbidden, Unauthorized
from inferpool.settings import ServerSettings

# Longer than any key a file may hold: refused before hashing (its length is no secret).
MAX_KEY_BYTES = 4096
REALM = 'Bearer realm="inferpool"'
NO_KEY = "this call needs an API key: Authorization: Bearer KEY or X-API-Key: KEY"
WRONG_KEY = "invalid API key"
# gRPC calls open to every client (the health probes).
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady", "Check", "Watch"})
# The admin's calls: load and unload, and Triton's trace and log settings (whose updates
# take the admin token, ``settings_rpc.py``).
ADMIN_METHODS = frozenset(
    {"RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting", "LogSettings"}
)
# The refusals' reason in /metrics (``inferpool_rejected_requests``) for a key over its rate.
KEY_RATE_LIMIT = "api_key_rate_limit"
# Calls whose ``name`` is a shared-memory region's, not a model's: server-wide calls.
REGION_METHODS = frozenset(
    {
        "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
    }
)  # fmt: skip
_BEARER = b"bearer "
_AUTHORIZATION = frozenset((b"authorization", "authorization"))
_API_KEY = frozenset((b"x-api-key", "x-api-key"))


class KeyScope:
    """What one key may call: every model (``models`` None) or those named; how often
    (``bucket`` None: no rate limit)."""

    __slots__ = ("bucket", "label", "models")

    def __init__(
        self, label: str, models: frozenset[str] | None, bucket: TokenBucket | None = None
    ) -> None:
        self.label = label
        self.models = models
        self.bucket = bucket


class ApiKeys:
    """The keys of one file, re-read by ``reload`` (``file_poll``)."""

    def __init__(self, path: Path, admin_token: bool = False) -> None:
        self.path = path
        # With an admin token, load and unload answer to it alone (admin.py).
        self.admin_token = admin_token
        self._salt = os.urandom(16)
        self._keys = self._read()

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ApiKeys | None:
        """None without a key file; SettingsError (one sentence) for an unusable one."""
        path = settings.api_keys_file
        if path is None:
            return None
        admin = settings.admin_token is not None or settings.admin_token_file is not None
        return cls(Path(path), admin)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ApiKeys({str(self.path)!r}, {len(self._keys)} keys)"

    def reload(self) -> None:
        self._keys = self._read()

    def _digest(self, key: bytes) -> bytes:
        return hashlib.blake2b(key, key=self._salt, digest_size=32).digest()

    def _read(self) -> dict[bytes, KeyScope]:
        try:
            text = self.path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
            raise SettingsError(f"cannot read the API key file {self.path}: {reason}") from None
        keys: dict[bytes, KeyScope] = {}
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            key, label, models, bucket = self._parsed(fields, number)
            if len(key) > MAX_KEY_BYTES or not key.isprintable():
                raise SettingsError(
                    f"line {number} of the API key file {self.path}: a key is at most "
                    f"{MAX_KEY_BYTES} printable ASCII characters"
                )
            keys[self._digest(key.encode())] = KeyScope(label, models, bucket)
        if not keys:
            raise SettingsError(f"the API key file {self.path} holds no key")
        return keys

    # -- the check ----------------------------------------------------------------------
    def check(
        self, pairs: Iterable[tuple[Any, Any]], model: str | None, admin: bool = False
    ) -> str:
        """The label of the key among ``pairs`` (the call's headers or metadata, names
        lower-case, str or bytes) that may call ``model`` (None: a server-wide call;
        ``admin``: load/unload, which need an unlimited key). Raises Unauthorized (no key,
        a wrong one) or Forbidden (a key limited to other models)."""
        key = presented(pairs)
        if key is None:
            raise Unauthorized(NO_KEY)
        scope = self._keys.get(self._digest(key)) if len(key) <= MAX_KEY_BYTES else None
        if scope is None:
            raise Unauthorized(WRONG_KEY)
        if scope.models is not None:
            if admin:
                raise Forbidden("loading and unloading need an API key not limited to models")
            if model is not None and model not in scope.models:
                raise Forbidden(f"this API key is not valid for model '{model}'")
        if scope.bucket is not None and model is not None and not admin:
            scope.bucket.check("this API key")  # RateLimited
        return scope.label

    def label(self, pairs: Iterable[tuple[Any, Any]]) -> str | None:
        """The label of the valid key among ``pairs``, else None (for the access log)."""
        key = presented(pairs)
        if key is None or len(key) > MAX_KEY_BYTES:
            return None
        scope = self._keys.get(self._digest(key))
        return scope.label if scope is not None else None

    def _parsed(
        self, fields: list[str], number: int
    ) -> tuple[str, str, frozenset[str] | None, TokenBucket | None]:
        """A line's key, label, models (None: every model) and rate limit (None: none)."""
        key, label, models = fields[0], f"line {number}", []
        limit: dict[str, float] = {}
        for field in fields[1:]:
            name, equals, value = field.partition("=")
            if name == "label" and equals:
                label = value
            elif name in ("rate", "burst") and equals:
                limit[name] = self._number(value, name, number)
            else:
                models.append(field)
        bucket = None
        if "rate" in limit:
            bucket = TokenBucket(limit["rate"], int(limit.get("burst", 0)))
        elif "burst" in limit:
            raise SettingsError(
                f"line {number} of the API key file {self.path}: burst= needs rate="
            )
        return key, label, frozenset(models) if models else None, bucket

    def _number(self, value: str, name: str, number: int) -> float:
        """A ``rate=`` (> 0) or ``burst=`` (a whole number >= 1) of line ``number``."""
        try:
            parsed = float(value) if name == "rate" else int(value)
        except ValueError:
            parsed = 0
        if not 0 < parsed < float("inf"):
            kind = "a whole number >= 1" if name == "burst" else "requests per second > 0"
            raise SettingsError(
                f"line {number} of the API key file {self.path}: {name}= takes {kind}, "
                f"not {value!r}"
            )
        return parsed


def presented(pairs: Iterable[tuple[Any, Any]]) -> bytes | None:
    """The key a call carries: ``authorization: Bearer KEY`` first, else ``x-api-key``.
    Names are bytes (ASGI, the HTTP/2 layer) or str (grpc.aio): one set lookup each."""
    api_key = None
    for name, value in pairs:
        if name in _AUTHORIZATION:
            if isinstance(value, str):
                value = value.encode("latin-1")
            if value[:7].lower() == _BEARER:
                return bytes(value[7:].strip())
        elif name in _API_KEY:
            api_key = bytes(value.encode("latin-1") if isinstance(value, str) else value).strip()
    return api_key


def rest_scope(path: str) -> tuple[bool, str | None, bool]:
    """What a REST path asks of a key: (needed, the model it names or None, admin).
    ``path`` is the ASGI path less its root_path."""
    if path in _OPEN_PATHS:
        return False, None, False
    if path.startswith("/v2/models/"):
        parts = path[len("/v2/models/") :].split("/")
        if parts[-1] == "ready" and len(parts) in (2, 4):
            return False, None, False
        if parts[-1] == "setting" and parts[-2] == "trace":
            return True, None, True
        name = parts[0]
        return True, (name if name != "stats" or len(parts) > 1 else None), False
    if path.startswith("/v2/repository/models/") and path.endswith(("/load", "/unload")):
        return True, None, True
    if path in _ADMIN_PATHS:
        return True, None, True
    if path.startswith("/v1/models/"):
        # KServe V1: GET /v1/models/{m} is the readiness KServe's probes ask (open);
        # {m}:predict and {m}:explain name their model before the colon.
        rest = path[len("/v1/models/") :]
        if "/" not in rest and ":" not in rest:
            return False, None, False
        return True, rest.partition(":")[0], False
    return True, None, False


# KServe V1's liveness is its root.
_OPEN_PATHS = frozenset(
    {"/v2/health/live", "/v2/health/ready", "/metrics", "/ping", "/health", "/"}
)
# Triton's trace and log settings: their updates take the admin token (settings_routes.py).
_ADMIN_PATHS = frozenset({"/v2/trace/setting", "/v2/logging"})
