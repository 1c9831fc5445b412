"""The table of wire formats (engine/worker/wire_formats.py): every request kind a worker
decodes has a loader whose module is a ``WireFormat``, the modules load on first use
only, and a kind without a wire format is refused by name."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.worker import wire_formats
from inferpool.engine.worker.wire_formats import (
    LOADERS,
    NO_WIRE_FORMAT,
    UnknownWireFormat,
    wire_format,
)
from inferpool.protocol import request_headers, rest_wire
from inferpool.protocol.types import InferenceResponse, Tensor
from inferpool.protocol.wire_format import WireFormat

SHM_KINDS = {Kind.REST_SHM, Kind.GRPC_SHM}


def test_every_kind_has_a_wire_format_or_is_named_as_having_none():
    assert set(LOADERS) | NO_WIRE_FORMAT == set(Kind)
    assert not set(LOADERS) & NO_WIRE_FORMAT


@pytest.mark.parametrize("kind", sorted(LOADERS), ids=lambda kind: kind.name)
def test_each_loader_gives_a_module_that_is_a_wire_format(kind):
    module = LOADERS[kind]()
    assert isinstance(module, WireFormat)
    # The shared-memory kinds' format reads the worker's own mappings of the regions.
    home = "inferpool.engine.worker." if kind in SHM_KINDS else "inferpool.protocol."
    assert module.__name__.startswith(home)
    assert wire_format(kind) is module
    assert wire_format(int(kind)) is module  # the ring's header carries a plain int


def test_a_module_without_encode_is_not_a_wire_format():
    from inferpool.protocol import json_scan

    assert not isinstance(json_scan, WireFormat)


@pytest.mark.parametrize("kind", sorted(NO_WIRE_FORMAT), ids=lambda kind: kind.name)
def test_a_kind_without_a_wire_format_is_refused_by_name(kind):
    with pytest.raises(UnknownWireFormat, match=f"no wire format for request kind {kind.name}"):
        wire_format(kind)


def test_a_number_that_is_no_kind_is_refused():
    with pytest.raises(UnknownWireFormat, match="request kind 99: no such kind"):
        wire_format(99)
    assert 99 not in wire_formats._LOADED  # nothing cached for it


def test_the_headers_format_wraps_the_rest_format():
    """REST_HEADERS: the headers block in front of a V2 body reaches the request's
    parameters, and the response's headers leave its body for a block in front."""
    fmt = wire_format(Kind.REST_HEADERS)
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    request = fmt.decode(request_headers.wrap({"x-team": "a"}, body), None)
    assert request.parameters["headers"] == {"x-team": "a"}
    assert request.inputs[0].data.tolist() == [1.0]
    output = Tensor("y", "FP32", (1,), request.inputs[0].data)
    response = InferenceResponse("m", [output], parameters={"headers": {"x-answer": "b"}})
    answer, json_length = fmt.encode(response, request)
    assert json_length is None
    plain, _ = rest_wire.encode(InferenceResponse("m", [output]), request)
    assert answer.endswith(plain)
    assert b"x-answer" in answer[: len(answer) - len(plain)]


def test_a_process_loads_only_the_formats_it_serves():
    """REST alone: gRPC's protobuf code and the headers block stay unloaded."""
    code = (
        "import sys\n"
        "from inferpool.engine.ipc.messages import Kind\n"
        "from inferpool.engine.worker.wire_formats import wire_format\n"
        "wire_format(Kind.REST)\n"
        "print(sorted(name for name in sys.modules if name.startswith('inferpool.protocol.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout
    assert "inferpool.protocol.rest_wire" in loaded
    for absent in ("grpc_wire", "generated", "request_headers", "generate_wire"):
        assert f"inferpool.protocol.{absent}" not in loaded, loaded
