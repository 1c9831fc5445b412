"""MLServer's ``cors_settings`` block: its keys and defaults, read as MLServer reads them.

Its own module because both ``ServerSettings`` (a field of it) and the MLServer server
contract (``server_settings``: the CORS keys of ``MLSERVER_*``) need it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CORSSettings(BaseModel):
    """MLServer's ``cors_settings``: the same keys and defaults (Starlette's CORSMiddleware)."""

    # Unknown keys are ignored as MLServer does, after a warning (see server_settings).
    model_config = ConfigDict(extra="ignore", frozen=True)

    allow_origins: list[str] = Field(
        default_factory=list, description="origins allowed to make cross-origin requests"
    )
    allow_origin_regex: str | None = Field(None, description="regex of allowed origins")
    allow_credentials: bool = Field(False, description="support cookies on CORS requests")
    allow_methods: list[str] = Field(default_factory=lambda: ["GET"])
    allow_headers: list[str] = Field(default_factory=list)
    expose_headers: list[str] = Field(default_factory=list)
    max_age: int = Field(600, description="seconds browsers may cache a CORS answer")

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        # MLServer's fields are Optional: an explicit null there means "the default".
        if value is None:
            field = cls.model_fields[info.field_name]
            return field.get_default(call_default_factory=True)
        return value
