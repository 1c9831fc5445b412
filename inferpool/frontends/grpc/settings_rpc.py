"""GRPCInferenceService's TraceSetting and LogSettings (Triton's ``trace`` and ``logging``
extensions), on both gRPC servers: the ``runtime_settings`` documents as Triton's
messages. A request with no settings reads them; one with settings updates them, an admin
action (the ``authorization`` metadata's bearer token, when one is set). A trace setting
sent with no value goes back to its default (the server's value, for a model).
"""

from __future__ import annotations

from typing import Any

from inferpool.engine.admin import authorization_of
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.runtime_settings import log_settings, trace_settings
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb


def _authorization(context: Any) -> str | None:
    return authorization_of(context.invocation_metadata() if context is not None else None)


class SettingsRpc:
    """The two RPCs over one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def trace_setting(
        self, request: pb.TraceSettingRequest, context: Any
    ) -> pb.TraceSettingResponse:
        changes = None
        if request.settings:
            changes = {key: list(value.value) or None for key, value in request.settings.items()}
        model = request.model_name or None
        document = trace_settings(self.plane, changes, model, _authorization(context))
        response = pb.TraceSettingResponse()
        for key, value in document.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def log_settings(
        self, request: pb.LogSettingsRequest, context: Any
    ) -> pb.LogSettingsResponse:
        changes = None
        if request.settings:
            changes = {key: _log_value(value) for key, value in request.settings.items()}
        document = log_settings(self.plane, changes, _authorization(context))
        response = pb.LogSettingsResponse()
        for key, value in document.items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response


def _log_value(value: pb.LogSettingsRequest.SettingValue) -> Any:
    """A SettingValue's one parameter (None when none is set: refused by the check)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)
