"""Long decimals in the JSON scanner's quick runs (issue 44 point 3): the floats Python
clients write through Python floats (``ndarray.tolist()`` + ``json.dumps``, 17 significant
digits: ``0.30000000000000004``, ``-0.13210485875606537``) are read in quick runs and wide
runs (``long_number``, ``long_window``), correctly rounded as ``float()`` rounds them, then
cast to the tensor's datatype as numpy casts float64 (FP32: the double rounded to float).

Every property compares the scanner's values with ``float()`` of each token (numpy's cast
for FP32) and the whole decoding with orjson + numpy (``same_outcome``); the ``quick`` and
``wide`` counters make sure the new paths really read the tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.unit.protocol.test_json_scan import (
    FLOAT_TYPES,
    PAD,
    PROPERTY,
    WINDOWS,
    engaged,
    halfway_points,
    quick,
    quick_tokens,
    request_text,
    same_outcome,
    wide,
    wide_runs,
    wide_tokens,
)

NUMPY = {"FP32": np.float32, "FP64": np.float64}


def expected(tokens: list[str], datatype: str) -> bytes:
    """The reference: each token through ``float()``, then numpy's cast to the datatype."""
    return np.array([float(t) for t in tokens], dtype=np.float64).astype(NUMPY[datatype]).tobytes()


def plain(token: str) -> bool:
    """A decimal with a point and no exponent, of at most 19 significant digits and 31
    characters after its sign: what the long paths take (shorter ones are quick tokens)."""
    body = token.lstrip("-")
    significant = body.replace(".", "").lstrip("0")
    return "." in body and "e" not in body and len(body) <= 31 and len(significant) <= 19


def read_all(tokens: list[str], datatype: str, sep: str) -> tuple[int, bytes]:
    """How many tokens quick runs read in a request of ``tokens``, and the values the
    scanner read (after checking the decoding is orjson + numpy's)."""
    body = request_text("[" + sep.join(tokens) + "]", datatype, [len(tokens)], pad=PAD)
    before = quick_tokens()
    values = engaged(body)[0].values
    read = quick_tokens() - before
    assert isinstance(values, np.ndarray)
    assert same_outcome(body)[0] == "ok"
    return read, values.tobytes()


# Doubles whose repr has no exponent: 1e-4 <= |v| < 1e16.
decimal_doubles = st.floats(min_value=1e-4, max_value=1e16, exclude_max=True).flatmap(
    lambda v: st.sampled_from([v, -v])
)
# float32 values written through Python floats, as tolist() does.
tolist_float32 = st.floats(width=32, min_value=2**-13, max_value=2**23).flatmap(
    lambda v: st.sampled_from([float(v), -float(v)])
)

EDGES = [
    "0.30000000000000004", "5.1000000000000005", "-0.13210485875606537",
    "0.1257302165031433", "9007199254740993.0", "9007199254740992.5", "9007199254740991.0",
    "9007199254740995.0", "-0.0000000000000000", "0.00000000000000001", "-0.00000000000000001",
    "123456789012345678.9", "1234567890123456789.0", "0.0012345678901234567",
    "0.00012345678901234567", "0.000000000000012345678901234567", "9999999999999999.5",
    "0.99999999999999999999", "1.0000000000000000000", "4503599627370496.5",
    "4503599627370497.5", "0.1000000000000000055511151231257827", "3.4028234663852886",
]  # fmt: skip


@quick
@PROPERTY
@given(
    values=st.lists(decimal_doubles | tolist_float32, min_size=2, max_size=80),
    datatype=st.sampled_from(FLOAT_TYPES),
    sep=st.sampled_from([",", ", ", ",\n  "]),
)
@example(values=[0.30000000000000004, 5.1000000000000005, -0.0, 2.0**53 + 2], datatype="FP64",
         sep=",")  # fmt: skip
def test_python_floats_are_read_in_quick_runs_as_float_reads_them(values, datatype, sep):
    tokens = [repr(v) for v in values]
    with wide_runs(False):
        read, got = read_all(tokens, datatype, sep)
    assert got == expected(tokens, datatype)
    # Every one but the last (a bracket follows it) in quick runs.
    assert read == len(tokens) - 1


@quick
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
@pytest.mark.parametrize("sep", [",", ", "])
def test_edge_decimals_are_read_as_float_reads_them(datatype, sep):
    taken = [t for t in EDGES if plain(t)]
    assert len(taken) == len(EDGES) - 5
    for tokens in (taken, EDGES, halfway_points()):
        _, got = read_all(tokens, datatype, sep)
        assert got == expected(tokens, datatype)
    # Each one in a quick run but the last (a bracket follows it); the others (over 19
    # significant digits or 31 characters, exponents) are read by read_number.
    assert read_all(taken, datatype, sep)[0] == len(taken) - 1


@quick
@PROPERTY
@given(
    whole=st.from_regex(r"-?(0|[1-9][0-9]{0,20})", fullmatch=True),
    fraction=st.from_regex(r"[0-9]{1,30}", fullmatch=True),
    datatype=st.sampled_from(FLOAT_TYPES),
)
def test_decimals_of_any_length_decode_as_orjson_and_numpy(whole, fraction, datatype):
    token = f"{whole}.{fraction}"
    tokens = ["1.5", token, "-2.25", token, "0.125"]
    read, got = read_all(tokens, datatype, ",")
    assert got == expected(tokens, datatype)
    if plain(token):
        assert read == 4


@quick
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
@pytest.mark.parametrize(
    "other",
    ["12345678901234567", "-1234567890123456789", "1.2345678901234567e-05", "00.1234567890123456",
     "0.12345678901234567.1", "-0.1234567890123456 ", "1.234567890123456-7", "0.1234567890123456.",
     "-.12345678901234567", "--0.1234567890123456", "1e400", "0.1234567890123456e0",
     "12345678901234567890123456789.0"],
)  # fmt: skip
def test_long_tokens_of_other_forms_decode_as_orjson_and_numpy(datatype, other):
    # Integers (ints to orjson), exponents, a space or a second point before the comma,
    # leading zeros, ... among long decimals: the same outcome, error or values.
    tokens = ["0.30000000000000004"] * 4 + [other] + ["-5.1000000000000005"] * 4
    for sep in (",", ", "):
        same_outcome(request_text("[" + sep.join(tokens) + "]", datatype, [9], pad=PAD))


@quick
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
def test_a_batch_as_python_clients_write_it_is_read_in_quick_runs(datatype):
    rows = np.random.default_rng(11).standard_normal((256, 50)).astype(np.float32)
    flat = rows.ravel().tolist()
    for separators in ((",", ":"), (", ", ": ")):
        data = json.dumps(flat, separators=separators)
        body = request_text(data, datatype, [256 * 50], pad=PAD)
        before = quick_tokens()
        values = engaged(body)[0].values
        # All but the last, and a few after one with an exponent (below 1e-4).
        assert quick_tokens() - before >= 0.99 * len(flat)
        assert values.tobytes() == np.array(flat).astype(NUMPY[datatype]).tobytes()
        same_outcome(body)


@wide
@pytest.mark.parametrize("windows", WINDOWS)
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
def test_a_compact_batch_as_python_clients_write_it_is_read_in_wide_runs(datatype, windows):
    rows = np.random.default_rng(12).standard_normal((256, 50)).astype(np.float32)
    flat = rows.ravel().tolist()
    body = request_text(json.dumps(flat, separators=(",", ":")), datatype, [len(flat)], pad=PAD)
    with wide_runs(True, windows):
        before = wide_tokens()
        values = engaged(body)[0].values
        read = wide_tokens() - before
    assert values.tobytes() == np.array(flat).astype(NUMPY[datatype]).tobytes()
    assert read >= 0.99 * len(flat)
    same_outcome(body)


@wide
@PROPERTY
@given(
    values=st.lists(decimal_doubles | tolist_float32 | st.sampled_from([0.5, -2.0, 0.0, 1e-5]),
                    min_size=2, max_size=300),
    datatype=st.sampled_from(FLOAT_TYPES),
    windows=st.sampled_from(WINDOWS),
)  # fmt: skip
@example(values=[10000000000000.0, 1.0], datatype="FP32", windows="avx2")  # 16 characters
def test_wide_runs_of_python_floats_are_read_as_float_reads_them(values, datatype, windows):
    tokens = [repr(v) for v in values]
    with wide_runs(True, windows):
        read, got = read_all(tokens, datatype, ",")
    assert got == expected(tokens, datatype)
    if all(plain(t) for t in tokens):
        assert read == len(tokens) - 1


@quick
def test_float32_is_the_double_rounded_again():
    # Just above the float32 halfway point 1 + 2^-24, but its nearest double is that
    # point itself: the double then the cast (ties to even) give 1.0, as numpy does; a
    # direct rounding of the decimal to float32 would give the next float32 up.
    token = "1.0000000596046448"
    assert float(token) == 1 + 2**-24
    tokens = [token, "-" + token] * 3
    read, got = read_all(tokens, "FP32", ",")
    assert np.frombuffer(got, np.float32).tolist() == [1.0, -1.0] * 3
    assert read == len(tokens) - 1
