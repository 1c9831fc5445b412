"""Triton's ``logging`` and ``trace`` extensions on both frontends' code
(``frontends/runtime_settings.py``, ``rest/settings_routes.py``, ``grpc/settings_rpc.py``)
on an in-process engine with an admin token: reads, an update changing the root logger's
level and the log format (set back after), each refused value (400 and nothing changed),
the token (401), and a model's trace settings (404 for a model not served)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inferpool import logs
from inferpool.engine.inprocess import InProcessClient
from inferpool.errors import BadRequest, InferpoolError
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.settings_rpc import SettingsRpc
from inferpool.frontends.rest.app import build_app
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.support import write_custom_model
from tests.unit.frontends.test_mlflow_scoring_routes import ECHO

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Whatever the tests change of the root logger's level and the log format, undone."""
    root = logging.getLogger()
    level, fmt = root.level, logs.log_format()
    try:
        yield
    finally:
        root.setLevel(level)
        if logs.log_format() != fmt:
            logs.set_format(fmt)


def run(tmp_path, scenario: Any) -> Any:
    write_custom_model(tmp_path / "echo", ECHO, "Echo")

    async def main() -> Any:
        settings = ServerSettings(
            model_repository=tmp_path, workers=0, admin_token=TOKEN, load_probe=False
        )
        client = InProcessClient(settings)
        await client.start()
        try:
            transport = httpx.ASGITransport(app=build_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await scenario(http, DataPlane(client))
        finally:
            await client.close()

    return asyncio.run(main())


def test_rest_logging_reads_updates_and_refuses(tmp_path, root_logging) -> None:
    logging.getLogger().setLevel(logging.INFO)

    async def scenario(http: httpx.AsyncClient, plane: DataPlane) -> dict[str, Any]:
        answers: dict[str, Any] = {"read": await http.get("/v2/logging")}
        answers["no token"] = await http.post("/v2/logging", json={"log_verbose_level": 1})
        answers["level after refusal"] = logging.getLogger().level
        answers["debug"] = await http.post(
            "/v2/logging", json={"log_verbose_level": 1, "log_format": "json"}, headers=ADMIN
        )
        answers["level"] = logging.getLogger().level
        answers["format"] = logs.log_format()
        answers["errors only"] = await http.post(
            "/v2/logging",
            json={"log_verbose_level": 0, "log_info": False, "log_warning": False,
                  "log_format": "default"},
            headers=ADMIN,
        )  # fmt: skip
        answers["empty"] = await http.post("/v2/logging", content=b" ", headers=ADMIN)
        bad = [
            {"log_info": "yes"},
            {"log_verbose_level": -1},
            {"log_verbose_level": True},
            {"log_format": "ISO8601"},
            {"log_file": "/tmp/log"},
            {"log_colour": 1},
        ]
        answers["bad"] = [await http.post("/v2/logging", json=b, headers=ADMIN) for b in bad]
        answers["level after bad"] = logging.getLogger().level
        return answers

    answers = run(tmp_path, scenario)
    assert answers["read"].json() == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": logs.log_format(),
    }  # fmt: skip
    assert answers["no token"].status_code == 401
    assert answers["level after refusal"] == logging.INFO
    assert answers["debug"].status_code == 200
    assert answers["debug"].json()["log_verbose_level"] == 1
    assert answers["debug"].json()["log_format"] == "json"
    assert answers["level"] == logging.DEBUG and answers["format"] == "json"
    errors_only = answers["errors only"].json()
    assert (errors_only["log_info"], errors_only["log_warning"], errors_only["log_error"]) == (
        False, False, True,
    )  # fmt: skip
    assert errors_only["log_format"] == "text"  # Triton's "default"
    assert answers["empty"].json() == errors_only  # no change asked: the settings as they are
    messages = [answer.json()["error"] for answer in answers["bad"]]
    assert [answer.status_code for answer in answers["bad"]] == [400] * 6
    assert messages[0] == "log_info must be true or false, not 'yes'"
    assert messages[1] == messages[2].replace("True", "-1")
    assert "log_format must be 'text'" in messages[3] and "'ISO8601'" in messages[3]
    assert messages[4] == "log_file cannot be set: the server writes its log to stderr"
    assert messages[5].startswith("unknown log setting 'log_colour'")
    assert answers["level after bad"] == logging.ERROR


def test_rest_trace_settings_of_the_server_and_of_a_model(tmp_path) -> None:
    async def scenario(http: httpx.AsyncClient, plane: DataPlane) -> dict[str, Any]:
        return {
            "server": await http.get("/v2/trace/setting"),
            "model": await http.get("/v2/models/echo/trace/setting"),
            "missing": await http.get("/v2/models/nope/trace/setting"),
            "no token": await http.post("/v2/trace/setting", json={"trace_rate": "5"}),
            "not json": await http.post("/v2/trace/setting", content=b"[1]", headers=ADMIN),
        }

    answers = run(tmp_path, scenario)
    assert answers["server"].status_code == 200
    assert answers["model"].json() == answers["server"].json()  # none of its own
    assert "trace_level" in answers["server"].json()
    assert answers["missing"].status_code == 404
    assert answers["no token"].status_code == 401
    assert answers["not json"].status_code == 400


class Context:
    def __init__(self, authorization: str | None) -> None:
        self.metadata = () if authorization is None else (("authorization", authorization),)

    def invocation_metadata(self) -> tuple:
        return self.metadata


def test_grpc_settings_rpcs(tmp_path, root_logging) -> None:
    logging.getLogger().setLevel(logging.WARNING)

    async def scenario(http: httpx.AsyncClient, plane: DataPlane) -> dict[str, Any]:
        rpc = SettingsRpc(plane)
        admin = Context(ADMIN["authorization"])
        out: dict[str, Any] = {"read": await rpc.log_settings(pb.LogSettingsRequest(), None)}
        update = pb.LogSettingsRequest()
        update.settings["log_info"].bool_param = True
        update.settings["log_verbose_level"].uint32_param = 0
        update.settings["log_format"].string_param = "text"
        out["updated"] = await rpc.log_settings(update, admin)
        out["level"] = logging.getLogger().level
        unset = pb.LogSettingsRequest()
        unset.settings["log_info"].SetInParent()  # a SettingValue with no parameter
        try:
            await rpc.log_settings(unset, admin)
        except BadRequest as exc:
            out["unset"] = exc.message
        try:
            await rpc.log_settings(update, Context(None))
        except InferpoolError as exc:
            out["no token"] = exc.status
        out["trace"] = await rpc.trace_setting(pb.TraceSettingRequest(model_name="echo"), None)
        return out

    out = run(tmp_path, scenario)
    read = out["read"].settings
    assert read["log_info"].bool_param is False and read["log_warning"].bool_param is True
    assert read["log_file"].string_param == ""
    assert out["updated"].settings["log_info"].bool_param is True
    assert out["level"] == logging.INFO
    assert out["unset"] == "log_info must be true or false, not None"
    assert out["no token"] == 401
    assert "trace_level" in out["trace"].settings
