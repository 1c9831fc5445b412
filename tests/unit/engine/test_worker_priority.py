"""The level the worker reads from a request body for each kind it queues: plain V2 JSON,
and the same body behind the table of shared-memory regions (a request whose tensors are
in regions still asks for its priority in its parameters)."""

from __future__ import annotations

import orjson

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.ipc.shared_memory import Region, wrap
from inferpool.engine.worker.priority import requested_level

BODY = orjson.dumps(
    {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 4],
                "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 16},
            }
        ],
        "parameters": {"priority": 3},
    }
)


def test_a_plain_rest_body_gives_its_level() -> None:
    assert requested_level(Kind.REST, BODY, None) == 3


def test_a_body_behind_the_region_table_gives_its_level() -> None:
    region = Region("/inferpool-test", 0, 64, 1)
    wrapped = wrap(Kind.REST, {"in": region}, BODY)
    assert requested_level(Kind.REST_SHM, wrapped, None) == 3


def test_without_the_word_nothing_is_unwrapped() -> None:
    body = BODY.replace(b'"priority":3', b'"other":3')
    region = Region("/inferpool-test", 0, 64, 1)
    assert requested_level(Kind.REST_SHM, wrap(Kind.REST, {"in": region}, body), None) == 0
