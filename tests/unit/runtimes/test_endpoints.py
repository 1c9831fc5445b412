"""The custom endpoint decorator, the table of a loaded runtime's endpoints, and the call
and answer framing (``protocol/endpoints.py``): what a bad registration is refused with."""

from __future__ import annotations

from typing import Any

import pytest

from inferpool import EndpointRequest, EndpointResponse, Runtime, custom_endpoint
from inferpool.errors import ModelLoadError
from inferpool.protocol.endpoints import (
    Announced,
    announce,
    call_body,
    normalize,
    read_call,
    take_announced,
)
from inferpool.runtimes.endpoints import endpoint_table
from inferpool.settings import ModelSettings


class Base(Runtime):
    def load(self) -> None:
        pass

    def predict(self, payload: Any, outputs: Any) -> Any:
        return payload


def runtime(cls: type[Runtime]) -> Runtime:
    return cls(ModelSettings(name="m", implementation="x.Y"))


@pytest.mark.parametrize(
    ("path", "normalized"),
    [("/a", "a"), ("a/b/c/", "a/b/c"), ("/v1.2/x~y-z_", "v1.2/x~y-z_"), ("explain", "explain")],
)
def test_paths_are_normalized(path: str, normalized: str) -> None:
    assert normalize(path) == normalized


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "each segment"),
        ("/a//b", "each segment"),
        ("/../etc", "each segment"),
        ("/.hidden", "each segment"),
        ("/a b", "each segment"),
        ("/infer", "'/infer' is the protocol's own route"),
        ("/feedback/x", "'/feedback' is the protocol's own route"),
        ("/versions/1/x", "'/versions' is the protocol's own route"),
        ("/docs", "'/docs' is the protocol's own route"),  # the model's OpenAPI pages
    ],
)
def test_unusable_paths_are_refused_when_the_class_is_defined(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        custom_endpoint(path)


def test_unknown_methods_are_refused() -> None:
    with pytest.raises(ValueError, match="methods must be among GET, POST"):
        custom_endpoint("/x", methods=["GET", "TRACE"])
    with pytest.raises(ValueError, match="got none"):
        custom_endpoint("/x", methods=[])


def test_table_holds_decorated_methods_and_the_dict_api() -> None:
    class Reports(Base):
        @custom_endpoint("/a/b", methods=["get", "POST", "GET"])
        def both(self, request: EndpointRequest) -> Any:
            return EndpointResponse(request.text(), status=202)

        def custom_endpoints(self) -> dict[str, Any]:
            return {"raw": lambda body: body[::-1]}

    table = endpoint_table(runtime(Reports))
    assert sorted(table) == ["a/b", "raw"]
    assert table["a/b"].methods == ("GET", "POST")
    assert table["raw"].methods == ("POST",)
    answer = table["a/b"].call(EndpointRequest("POST", "a/b", body=b"hi"))
    assert answer.status == 202 and answer.body == "hi"
    raw = table["raw"].call(EndpointRequest("POST", "raw", body=b"abc"))
    assert raw.body == b"cba" and raw.content_type == "application/json"


def test_a_path_registered_twice_fails_the_load() -> None:
    class Twice(Base):
        @custom_endpoint("/x")
        def one(self, request: EndpointRequest) -> Any:
            return 1

        def custom_endpoints(self) -> dict[str, Any]:
            return {"x": lambda body: 2}

    with pytest.raises(ModelLoadError, match="'/x' is registered twice"):
        endpoint_table(runtime(Twice))

    class Reserved(Base):
        def custom_endpoints(self) -> dict[str, Any]:
            return {"infer": lambda body: 2}

    with pytest.raises(ModelLoadError, match="protocol's own route"):
        endpoint_table(runtime(Reserved))


def test_request_helpers_refuse_bad_bodies_with_400() -> None:
    request = EndpointRequest("POST", "p", body=b"\xff{")
    with pytest.raises(Exception, match="not valid JSON") as caught:
        request.json()
    assert getattr(caught.value, "status", None) == 400
    with pytest.raises(Exception, match="not UTF-8"):
        request.text()


def test_call_framing_round_trips_and_refuses_truncation() -> None:
    body = call_body("a/b", b"\x00payload", "GET", "q=1", [("x-h", "v")])
    call, payload = read_call(body)
    assert (call.path, call.method, call.query, call.headers) == (
        "a/b",
        "GET",
        "q=1",
        [("x-h", "v")],
    )
    assert payload == b"\x00payload"
    with pytest.raises(Exception, match="malformed custom endpoint call"):
        read_call(body[:6])


def test_announced_endpoints_leave_the_metadata_as_it_was() -> None:
    metadata = {"name": "m", "inputs": []}
    sent = announce(metadata, Announced({"a": ["GET"]}, bare=True))
    assert take_announced(sent) == Announced({"a": ["GET"]}, bare=True)
    assert sent == metadata
    assert take_announced({"name": "m"}) == Announced()
