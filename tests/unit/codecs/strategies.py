"""Hypothesis strategies for codec property tests, and a REST wire round trip."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferpool.protocol import rest_json
from inferpool.protocol.binary import split_binary_outputs
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE
from inferpool.protocol.types import InferenceResponse, Tensor

NUMERIC = [name for name in NUMPY_BY_DATATYPE if name != "BYTES"]
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def numeric_arrays(draw, datatype: str | None = None) -> np.ndarray:
    """Any numeric V2 datatype, any shape (empty and scalar too), NaN and inf included."""
    name = datatype or draw(st.sampled_from(NUMERIC))
    return draw(hnp.arrays(NUMPY_BY_DATATYPE[name], shapes))


texts = st.text(max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)


@st.composite
def datetimes(draw) -> np.ndarray:
    """datetime64 arrays of every common unit, NaT included."""
    unit = draw(st.sampled_from(["D", "s", "ms", "us", "ns"]))
    ticks = st.integers(-(2**31), 2**31) | st.just(np.iinfo(np.int64).min)  # min is NaT
    return draw(hnp.arrays(np.int64, shapes, elements=ticks)).view(f"datetime64[{unit}]")


def through_rest(tensors: list[Tensor], binary: bool, parameters: dict | None = None):
    """Outputs sent as a REST response (JSON, or JSON + binary tail) and parsed back."""
    response = InferenceResponse("m", tensors, parameters=dict(parameters or {}))
    if not binary:
        return rest_json.decode_response(rest_json.encode_response(response))
    header, tail = split_binary_outputs(tensors, [True] * len(tensors))
    document = rest_json.encode_response(response, header)
    return rest_json.decode_response(b"".join([document, *tail]), len(document))
