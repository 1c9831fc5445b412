"""Who may change the model repository: the control mode and the admin token.

``AdminPolicy`` is built once at start-up from the settings (the token file is read
then, never again) and asked by both frontends before a load or unload:
``require(authorization)`` takes the value of the REST ``Authorization`` header or of
the gRPC ``authorization`` metadata. The token itself is never logged nor shown in an
error or a repr.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

from inferpool.errors import Forbidden, Unauthorized
from inferpool.settings import ServerSettings

DISABLED = "the model repository API is disabled (--model-control-mode none)"
_SCHEME = "bearer "


class SettingsError(ValueError):
    """A setting that makes the server refuse to start; the message says which and why."""


class AdminPolicy:
    """The repository API's guard: is it enabled, and which bearer token does it want."""

    __slots__ = ("_token", "control_mode")

    def __init__(self, control_mode: str = "explicit", token: str | None = None) -> None:
        self.control_mode = control_mode
        self._token = token.encode() if token else None

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> AdminPolicy:
        """The policy of ``settings``; SettingsError for a token that cannot be used."""
        return cls(settings.model_control_mode, _admin_token(settings))

    @property
    def token_required(self) -> bool:
        return self._token is not None

    def __repr__(self) -> str:
        return f"AdminPolicy({self.control_mode!r}, token={'set' if self._token else 'unset'})"

    def require(self, authorization: str | None) -> None:
        """Allow a load or unload: 401 without the right token, 403 when the API is off.

        The token is checked first, so an unauthenticated peer learns nothing of the
        server's configuration.
        """
        self.require_token(authorization)
        self.require_enabled()

    def require_token(self, authorization: str | None) -> None:
        """Allow an admin action that is not the repository's (Triton's trace and log
        settings updates): 401 without the right token, when one is set."""
        if self._token is not None:
            if authorization is None:
                raise Unauthorized("this call needs the admin token: Authorization: Bearer TOKEN")
            given = authorization.strip()
            if given[: len(_SCHEME)].lower() != _SCHEME:
                raise Unauthorized("the admin token must be sent as Authorization: Bearer TOKEN")
            # Constant time: the comparison must not reveal how much of a guess was right.
            if not hmac.compare_digest(given[len(_SCHEME) :].strip().encode(), self._token):
                raise Unauthorized("wrong admin token")

    def require_enabled(self) -> None:
        """403 in ``none`` mode only: in ``poll`` the API works beside the watcher
        (Triton refuses it there; a model then loads or unloads without touching files)."""
        if self.control_mode == "none":
            raise Forbidden(DISABLED)


def authorization_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The ``authorization`` value of gRPC invocation metadata, or None."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def _admin_token(settings: ServerSettings) -> str | None:
    token, path = settings.admin_token, settings.admin_token_file
    if token is not None and path is not None:
        raise SettingsError("give --admin-token or --admin-token-file, not both")
    if path is not None:
        token = _read_token_file(Path(path))
    elif token is not None:
        token = token.strip()
        if not token:
            raise SettingsError("--admin-token is empty")
    if token is not None and not (token.isascii() and token.isprintable()):
        raise SettingsError("the admin token must be one line of printable ASCII characters")
    return token


def _read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(f"cannot read the admin token file {path}: {reason}") from None
    if not token:
        raise SettingsError(f"the admin token file {path} is empty")
    return token
