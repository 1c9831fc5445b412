"""The JSON tensor scanner (issue 18 point 4): a REST JSON request decodes to exactly what
orjson + numpy make of it (the path without the scanner), errors included.

Every property compares ``decode_request`` (scanner first) with ``reference`` (orjson on
the whole body, then the decoder): the same tensors bit for bit (NaN positions and the
sign of zero included), or the same error class and message. The ``engaged`` checks make
sure the scanner really read the arrays a property is about, so that a scanner that
gives up on everything cannot pass.
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inferpool.errors import BadRequest, InferpoolError
from inferpool.protocol import json_scan, limits, rest_json
from inferpool.protocol.datatypes import DATATYPES
from inferpool.protocol.types import InferenceRequest

pytestmark = pytest.mark.skipif(
    not json_scan.AVAILABLE, reason="the _jsonscan extension is not built"
)

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FLOAT_TYPES = ["FP32", "FP64"]
INT_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


def reference(body: bytes) -> InferenceRequest:
    """The decoder without the scanner: orjson (or the standard library) on the body."""
    return rest_json.request_from_document(rest_json.parse_json_object(body), binary_tail=None)


def described(decode: Callable[[bytes], InferenceRequest], body: bytes) -> tuple[Any, ...]:
    """A request as comparable values (data as raw bytes), or the error it raised."""
    try:
        request = decode(body)
    except InferpoolError as exc:
        return ("error", type(exc).__name__, exc.message)
    tensors = []
    for tensor in request.inputs:
        data = tensor.data
        content = data.reshape(-1).tolist() if data.dtype == object else data.tobytes()
        tensors.append(
            (
                tensor.name,
                tensor.datatype,
                tensor.shape,
                tensor.parameters,
                data.dtype.str,
                data.shape,
                data.flags.c_contiguous,
                data.flags.writeable,
                content,
            )
        )
    outputs = [(o.name, o.parameters) for o in request.outputs]
    return ("ok", request.id, request.parameters, outputs, tensors)


def same_outcome(body: bytes) -> tuple[Any, ...]:
    """Assert the scanner's decoding is the reference's; return it."""
    fast = described(rest_json.decode_request, body)
    assert fast == described(reference, body), body[:300]
    return fast


def engaged(body: bytes) -> dict[int, json_scan.ScannedData]:
    """The data arrays the scanner read in the body, by input index."""
    current = limits.current()
    scanned = json_scan.scan(body, current, current.max_json_depth - 3)
    return {} if scanned is None else scanned[1]


def request_text(
    data: str, datatype: str, shape: list[int], data_first: bool = False, pad: int = 0
) -> bytes:
    """A request of one input; ``pad`` characters of parameters after the outputs."""
    header = f'"name": "x", "shape": {shape}, "datatype": "{datatype}"'
    fields = f'"data": {data}, {header}' if data_first else f'{header}, "data": {data}'
    tail = f', "parameters": {{"pad": "{"p" * pad}"}}' if pad else ""
    return (
        '{"id": "r", "inputs": [{' + fields + '}], "outputs": [{"name": "y"}]' + tail + "}"
    ).encode()


def nest(tokens: list[str], dims: list[int], seps: Iterator[str]) -> str:
    """Tokens nested row-major as ``dims`` (whose product is their count)."""
    if len(dims) <= 1:
        text = tokens[0]
        for token in tokens[1:]:
            text += next(seps) + token
        return "[" + text + "]"
    step = len(tokens) // dims[0]
    rows = [nest(tokens[i * step : (i + 1) * step], dims[1:], seps) for i in range(dims[0])]
    return "[" + ", ".join(rows) + "]"


separators = st.sampled_from([",", ", ", " ,", ",\n", "\t,\r\n ", " , "])

FLOAT_FORMATS: list[Callable[[float], str]] = [
    repr,
    lambda v: orjson.dumps(v).decode(),
    lambda v: f"{v:.17g}",
    lambda v: f"{v:.9g}",
    lambda v: f"{v:e}",
    lambda v: f"{v:.6E}",
    lambda v: f"{v:.3f}",
    lambda v: f"{v:.25e}",
]


# --------------------------------------------------------------------------- floats


@PROPERTY
@given(
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=60),
    form=st.sampled_from(FLOAT_FORMATS),
    datatype=st.sampled_from(FLOAT_TYPES),
    sep=separators,
    data_first=st.booleans(),
)
@example(values=[-0.0, 0.0, 5e-324, 1.7976931348623157e308], form=repr, datatype="FP64",
         sep=",", data_first=False)  # fmt: skip
@example(values=[3.4028235e38, 3.4028236e38, 1e-46], form=repr, datatype="FP32", sep=",",
         data_first=False)  # fmt: skip
def test_float_lists_decode_as_orjson_and_numpy(values, form, datatype, sep, data_first):
    text = "[" + sep.join(form(v) for v in values) + "]"
    body = request_text(text, datatype, [len(values)], data_first)
    same_outcome(body)
    if form in (repr, FLOAT_FORMATS[1]) and datatype == "FP64" and len(values) <= 32:
        # Shortest round-trip forms of finite doubles: read by the scanner every time, up
        # to SLOW_TRIAL of them (more, and mostly subnormal, they are left to orjson).
        assert isinstance(engaged(body)[0].values, np.ndarray)


@PROPERTY
@given(
    values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1,
                    max_size=60),
    sep=separators,
)  # fmt: skip
def test_float32_values_are_read_by_the_scanner(values, sep):
    tokens = [str(np.float32(v)) for v in values]  # how a float32 client writes them
    body = request_text("[" + sep.join(tokens) + "]", "FP32", [len(values)])
    outcome = same_outcome(body)
    assert outcome[0] == "ok"
    assert isinstance(engaged(body)[0].values, np.ndarray)


@st.composite
def number_tokens(draw: st.DrawFn) -> str:
    """Any JSON number: long digit strings, exponents of every form, -0 and 0.0e0."""
    sign = draw(st.sampled_from(["", "-"]))
    whole = draw(st.just("0") | st.from_regex(r"[1-9][0-9]{0,24}", fullmatch=True))
    fraction = draw(st.just("") | st.from_regex(r"\.[0-9]{1,40}", fullmatch=True))
    exponent = draw(
        st.just("")
        | st.from_regex(r"[eE][+-]?0{0,3}[0-9]{1,2}", fullmatch=True)
        | st.from_regex(r"[eE][+-]?[0-9]{3,6}", fullmatch=True)
    )
    return sign + whole + fraction + exponent


@PROPERTY
@given(
    tokens=st.lists(number_tokens(), min_size=1, max_size=30),
    datatype=st.sampled_from(FLOAT_TYPES + INT_TYPES + ["BOOL", "FP16"]),
    sep=separators,
)
@example(tokens=["1E5", "1e-5", "-0", "0.0e0", "-0.0", "-0e-5", "1e-400", "1e400"],
         datatype="FP64", sep=",")  # fmt: skip
@example(tokens=["-0", "0.0e0", "1E5", "1e-5", "2.4703282292062328e-324"], datatype="FP32",
         sep=", ")  # fmt: skip
@example(tokens=["9007199254740993", "1.5"], datatype="FP64", sep=",")
@example(tokens=["123456789012345", "-999999999999999999"], datatype="INT64", sep=",")
@example(tokens=["9223372036854775807", "18446744073709551615"], datatype="UINT64", sep=",")
@example(tokens=["1" + "0" * 400], datatype="FP64", sep=",")
@example(tokens=["0." + "0" * 30 + "1e330"], datatype="FP64", sep=",")
def test_number_forms_decode_as_orjson_and_numpy(tokens, datatype, sep):
    same_outcome(request_text("[" + sep.join(tokens) + "]", datatype, [len(tokens)]))


# --------------------------------------------------------------------------- quick runs
# Plain decimals followed by a comma are read in runs (SSSE3, a 64-byte window of commas
# ahead of the token): bodies padded after the data, so that every token is in a window.

# Characters of padding after the data: every token is then in a 64-byte window of commas
# with the 17 bytes a token is read from after it.
PAD = 120

quick = pytest.mark.skipif(
    not (json_scan.AVAILABLE and json_scan._jsonscan.quick_stats()[0]),
    reason="quick runs need the extension on a CPU with SSSE3",
)


def quick_tokens() -> int:
    assert json_scan._jsonscan is not None
    return json_scan._jsonscan.quick_stats()[1]


@st.composite
def plain_decimals(draw: st.DrawFn) -> str:
    """The quick form and its near misses: -?(0|[1-9]d*)(.d+)?, up to 15 characters
    after the sign, and some longer or slightly off."""
    sign = draw(st.sampled_from(["", "-"]))
    whole = draw(st.just("0") | st.from_regex(r"[1-9][0-9]{0,15}", fullmatch=True))
    fraction = draw(st.just("") | st.from_regex(r"\.[0-9]{1,16}", fullmatch=True))
    return sign + whole + fraction


NEAR_MISSES = (
    ["01", "-01.5", "1.", "-.5", ".5", "-", "--1", "1..2", "1.2.3", "1e5", "1.5E-3", "0x1",
     "1.5e", "+1", "00", "-0", "-0.0", "0.000000000000001", "999999999999999", "1e400",
     "1.5 ", "7x", '"1"', "1234567890123456", "-1.23456789012345", "0.0000000000000001",
     "1-2", "12-5", "1 2", "1.5 2", "1\t2"]
)  # fmt: skip
near_misses = st.sampled_from(NEAR_MISSES)


@quick
@pytest.mark.parametrize("miss", NEAR_MISSES)
@pytest.mark.parametrize("at", [0, 3, 7])
def test_a_near_miss_in_a_quick_run_decodes_as_orjson_and_numpy(miss, at):
    tokens = ["1.5", "-2", "0.25"] * 3
    tokens.insert(at, miss)
    for datatype in FLOAT_TYPES:
        same_outcome(request_text("[" + ",".join(tokens) + "]", datatype, [len(tokens)], pad=PAD))
        same_outcome(request_text("[" + ", ".join(tokens) + "]", datatype, [len(tokens)], pad=PAD))


@quick
@PROPERTY
@given(
    tokens=st.lists(plain_decimals(), min_size=1, max_size=60),
    misses=st.lists(st.tuples(st.integers(0, 60), near_misses), max_size=2),
    datatype=st.sampled_from([*FLOAT_TYPES, "INT32"]),
    sep=separators,
)
@example(tokens=["-0", "-0.0", "0", "1", "-1", "0.5", "123456789012345", "1.00000000000001",
                 "-99999999.999999"], misses=[], datatype="FP32", sep=",")  # fmt: skip
def test_quick_runs_decode_as_orjson_and_numpy(tokens, misses, datatype, sep):
    for at, miss in misses:
        tokens.insert(at, miss)
    text = "[" + sep.join(tokens) + "]"
    same_outcome(request_text(text, datatype, [len(tokens)], pad=PAD))
    if len(tokens) > 2:
        same_outcome(request_text(f"[{text}, {text}]", datatype, [2, len(tokens)], pad=PAD))


@quick
@PROPERTY
@given(
    values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e7,
                              max_value=1e7), min_size=2, max_size=60),
    sep=st.sampled_from([",", ", ", ",\n  "]),
    datatype=st.sampled_from(FLOAT_TYPES),
)  # fmt: skip
def test_quick_runs_read_every_float32_a_client_writes(values, sep, datatype):
    # str(np.float32) of values in this range has no exponent below 1e16 or over 1e-5.
    tokens = [str(np.float32(v)) for v in values]
    plain = [t for t in tokens if "e" not in t and len(t.lstrip("-")) <= 15]
    before = quick_tokens()
    body = request_text("[" + sep.join(tokens) + "]", datatype, [len(values)], pad=PAD)
    outcome = same_outcome(body)
    assert outcome[0] == "ok"
    # Every plain token followed by a comma is read in a run, but the first after a token
    # of another form (then read_number reads up to 16 values before the next run).
    if len(plain) == len(tokens):
        assert quick_tokens() - before == len(tokens) - 1


# Decimals exactly halfway between two float32 values (ties to even), and next to such a
# point, read in quick runs: where a faster scaling than the division (a multiplication by
# 10^-k, tried in RESULTS.md) would round otherwise.
FLOAT32_HALFWAYS = (
    # A multiplication by 10^-k rounds these four to another float32 than the division.
    ["59562.173828125", "924402.28125", "-793131.53125", "715073.53125",
     "8388609.5", "8388610.5", "-8388609.5", "4194304.25", "4194304.75", "2097152.125",
     "1048576.0625", "16777217", "16777219", "33554434", "8388609.49999", "8388609.50001",
     "4194304.2500001", "1.0000000596046", "0.1000000014901", "3.4028234663853"]
)  # fmt: skip


@quick
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
def test_float32_halfway_points_in_quick_runs_decode_as_orjson_and_numpy(datatype):
    tokens = [t for halfway in FLOAT32_HALFWAYS for t in (halfway, "1.5")]
    before = quick_tokens()
    outcome = same_outcome(
        request_text("[" + ",".join(tokens) + "]", datatype, [len(tokens)], pad=PAD)
    )
    assert outcome[0] == "ok"
    assert quick_tokens() - before == len(tokens) - 1  # all in runs but the last


@quick
def test_a_batch_as_a_float32_client_writes_it_is_read_in_quick_runs():
    rows = np.random.default_rng(7).standard_normal((256, 50)).astype(np.float32)
    tokens = [[str(v) for v in row] for row in rows]
    plain = sum(1 for row in tokens for t in row if "e" not in t)
    flat = "[" + ",".join(t for row in tokens for t in row) + "]"
    nested = "[" + ",".join("[" + ",".join(row) + "]" for row in tokens) + "]"
    for body in (request_text(data, "FP32", [256, 50], pad=PAD) for data in (flat, nested)):
        before = quick_tokens()
        (tensor,) = rest_json.decode_request(body).inputs
        assert tensor.data.tobytes() == rows.tobytes()
        # All but each row's last value (and a few after a token with an exponent).
        assert quick_tokens() - before >= 0.9 * plain
        same_outcome(body)


def test_float32_written_through_python_floats_is_read_by_the_scanner():
    # ndarray.tolist() of float32 values (tritonclient's and MLServer's JSON encoders) has
    # 17 significant digits: past Clinger's fast path, read by Eisel-Lemire.
    rows = np.random.default_rng(8).standard_normal((256, 50)).astype(np.float32)
    body = request_text(orjson.dumps(rows.tolist()).decode(), "FP32", [256, 50])
    assert engaged(body)[0].values.tobytes() == rows.tobytes()
    outcome = same_outcome(body)
    assert outcome[0] == "ok" and outcome[4][0][-1] == rows.tobytes()


def test_the_whole_body_goes_to_orjson_after_an_array_of_long_numbers():
    # More digits than 19: past Eisel-Lemire too, read by PyOS_string_to_double.
    long = "[" + ",".join(f"{v:.25e}" for v in np.arange(1, 101) / 7) + "]"
    short = request_text("[" + ",".join(["1.5"] * 100) + "]", "FP32", [100])
    assert 0 in engaged(short)
    document = orjson.loads(short)
    document["inputs"].insert(0, {"name": "w", "shape": [100], "datatype": "FP64", "data": 0})
    body = orjson.dumps(document).replace(b'"data":0', b'"data":' + long.encode(), 1)
    assert engaged(body) == {}  # input 1 alone would be read, but orjson reads them all
    assert same_outcome(body)[0] == "ok"


LONG_FORMS: list[Callable[[float], str]] = [
    repr,
    lambda v: f"{v:.17g}",
    lambda v: f"{v:.18e}",
    lambda v: f"{v:.16e}",
    lambda v: f"{-v:.17e}",
]


@PROPERTY
@given(
    values=st.lists(
        st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False).filter(
            lambda v: 1e-300 < abs(v) < 1e300
        ),
        min_size=1,
        max_size=200,
    ),
    form=st.sampled_from(LONG_FORMS),
)
def test_numbers_of_16_to_19_digits_are_read_as_float_reads_them(values, form):
    # Eisel-Lemire: every such number, whatever its exponent, with no give-up. (A float
    # token, not an integer one: "1000000000000000" is an int to orjson.)
    tokens = [t if "." in t or "e" in t else t + ".0" for t in map(form, values)]
    body = request_text("[" + ",".join(tokens) + "]", "FP64", [len(tokens)])
    scanned = engaged(body)[0].values
    assert scanned.tobytes() == np.array([float(t) for t in tokens]).tobytes()
    same_outcome(body)
    same_outcome(body.replace(b'"FP64"', b'"FP32"'))


def halfway_points() -> list[str]:
    """Decimals exactly halfway between two doubles, in at most 19 digits: odd multiples
    of half a unit in the last place, from 2^53 (spacing 2) up to 2^63 (spacing 2^11)."""
    points = []
    for exponent in range(53, 64):
        half = 1 << (exponent - 53)  # half the spacing of doubles in [2^exponent, 2^(e+1))
        for odd in (1, 3, 5, 7, 2**20 + 1, 2**52 - 1):
            value = (1 << exponent) + odd * half
            digits = str(value)
            points.append(f"{digits[0]}.{digits[1:]}e{len(digits) - 1}")
            points.append(f"{value}.0")
    return points


def test_halfway_points_round_to_even_as_float_does():
    tokens = halfway_points()
    body = request_text("[" + ", ".join(tokens) + "]", "FP64", [len(tokens)])
    scanned = engaged(body)[0].values
    assert scanned.tobytes() == np.array([float(t) for t in tokens]).tobytes()
    same_outcome(body)


@pytest.mark.parametrize(
    "token",
    ["1e23", "8.98846567431158e307", "1.7976931348623157e308", "2.2250738585072014e-308",
     "2.2250738585072011e-308", "4.9406564584124654e-324", "9007199254740993.0",
     "0.1000000000000000055511151231257827", "123456789012345678e-5", "7.0e-10",
     "1.00000000000000011102230246251565404236316680908203125"],
)  # fmt: skip
def test_hard_cases_decode_as_orjson_and_numpy(token):
    # Past the largest power Clinger's path takes, the largest and smallest normal doubles
    # (and a subnormal, left to PyOS_string_to_double), a tie, long ones.
    same_outcome(request_text(f"[{token}, {token}]", "FP64", [2]))


@pytest.mark.parametrize("every", [5, 50])
def test_a_few_long_numbers_among_short_ones_stay_with_the_scanner(every):
    # A fifth or fewer of them read by PyOS_string_to_double (25 digits: past Eisel-Lemire
    # too): the scan still costs less than orjson.
    values = np.random.default_rng(9).standard_normal(2000)
    tokens = [f"{v:.25e}" if i % every == 0 else f"{v:.4f}" for i, v in enumerate(values)]
    body = request_text("[" + ", ".join(tokens) + "]", "FP64", [len(tokens)])
    assert 0 in engaged(body)
    same_outcome(body)


# --------------------------------------------------------------------------- wide runs
# Compact arrays (a comma and nothing else after each token) are read a 64-byte window at a
# time with AVX2 where the CPU has it; the quick-run tests above take them too. Here: that
# they are taken, and that every window they refuse or cut short reads as before, with and
# without them.

wide = pytest.mark.skipif(
    not (json_scan.AVAILABLE and json_scan._jsonscan.wide_stats()[0]),
    reason="wide runs need the extension on a CPU with AVX2",
)


def wide_tokens() -> int:
    assert json_scan._jsonscan is not None
    return json_scan._jsonscan.wide_stats()[2]


def wide512_tokens() -> int:
    assert json_scan._jsonscan is not None
    return json_scan._jsonscan.wide512_stats()[2]


# The windows a wide run can take on this CPU: AVX-512 ones (VBMI2) where it has them, the
# AVX2 ones always (with AVX-512 ones switched off).
WINDOWS = [
    *(["avx512"] if json_scan.AVAILABLE and json_scan._jsonscan.wide512_stats()[0] else []),
    "avx2",
]


@contextmanager
def wide_runs(enabled: bool, windows: str = WINDOWS[0]) -> Iterator[None]:
    assert json_scan._jsonscan is not None
    before = json_scan._jsonscan.wide_stats()[1]
    before512 = json_scan._jsonscan.wide512_stats()[1]
    json_scan._jsonscan.wide_stats(enabled)
    json_scan._jsonscan.wide512_stats(windows == "avx512")
    try:
        yield
    finally:
        json_scan._jsonscan.wide_stats(before)
        json_scan._jsonscan.wide512_stats(before512)


# What a window must refuse or stop at: the quick form's near misses, and the bytes that
# end a window's tokens early (whitespace, brackets of a nested array).
WIDE_MISSES = [*NEAR_MISSES, "1 ", " 1", "\n2", "123456789012345.6", "-123456789012345"]


@wide
@PROPERTY
@given(
    tokens=st.lists(plain_decimals(), min_size=1, max_size=400),
    misses=st.lists(st.tuples(st.integers(0, 400), st.sampled_from(WIDE_MISSES)), max_size=3),
    datatype=st.sampled_from(FLOAT_TYPES),
    shortfall=st.sampled_from([0, 0, 1, 7, 33, 90]),
    rows=st.sampled_from([1, 2, 3]),
)
def test_wide_runs_decode_as_orjson_and_numpy(tokens, misses, datatype, shortfall, rows):
    for at, miss in misses:
        tokens.insert(at, miss)
    if len(tokens) < rows:
        rows = 1
    per_row = len(tokens) // rows
    tokens = tokens[: rows * per_row]
    dims = [rows, per_row] if rows > 1 else [len(tokens)]
    text = nest(tokens, dims, itertools.repeat(","))
    # A shape short of the count: the windows stop where the buffer does.
    shape = dims if rows > 1 else [max(len(tokens) - shortfall, 0)]
    for enabled, windows in [*((True, w) for w in WINDOWS), (False, "avx2")]:
        with wide_runs(enabled, windows):
            same_outcome(request_text(text, datatype, shape, pad=PAD))


@wide
@PROPERTY
@given(
    tokens=st.lists(
        st.integers(-99, 99).map(str) | plain_decimals() | st.sampled_from(WIDE_MISSES),
        min_size=1,
        max_size=300,
    ),
    datatype=st.sampled_from(FLOAT_TYPES),
    shortfall=st.sampled_from([0, 1, 5, 9, 40]),
)
def test_windows_of_many_short_tokens_decode_as_orjson_and_numpy(tokens, datatype, shortfall):
    # Short integers put more tokens in a window than an AVX-512 window takes (eight);
    # tokens of 14 to 17 digits are on either side of the 15 digits one takes.
    text = "[" + ",".join(tokens) + "]"
    shape = [max(len(tokens) - shortfall, 0)]
    for windows in WINDOWS:
        with wide_runs(True, windows):
            same_outcome(request_text(text, datatype, shape, pad=PAD))


@wide
@pytest.mark.parametrize("windows", WINDOWS)
@pytest.mark.parametrize("datatype", FLOAT_TYPES)
def test_a_compact_float32_batch_is_read_in_wide_runs(datatype, windows):
    rows = np.random.default_rng(11).standard_normal((256, 50)).astype(np.float32)
    tokens = [str(v) for v in rows.ravel()]
    body = request_text("[" + ",".join(tokens) + "]", datatype, [256, 50], pad=PAD)
    plain = sum(1 for t in tokens if "e" not in t)
    with wide_runs(True, windows):
        before, before512 = wide_tokens(), wide512_tokens()
        (tensor,) = rest_json.decode_request(body).inputs
        expected = np.array([float(t) for t in tokens]).astype(tensor.data.dtype)
        assert tensor.data.tobytes() == expected.tobytes()
        # All but the last value and those next to a token with an exponent.
        assert wide_tokens() - before >= 0.9 * plain
        if windows == "avx512":
            assert wide512_tokens() - before512 == wide_tokens() - before
        else:
            assert wide512_tokens() == before512
    with wide_runs(False):
        before = wide_tokens()
        same_outcome(body)
        assert wide_tokens() == before  # switched off: the SSSE3 loop read them


@wide
def test_wide_runs_pause_where_other_forms_are_close_together():
    # Every third value with an exponent: each wide run would read two tokens, less than
    # it costs; after a few, quick runs go without (the pause doubles to 1024 runs).
    values = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    tokens = [str(v * np.float32(1e-6)) if i % 3 == 0 else str(v) for i, v in enumerate(values)]
    assert sum("e" in t for t in tokens) >= 900
    with wide_runs(True):
        before = wide_tokens()
        same_outcome(request_text("[" + ",".join(tokens) + "]", "FP32", [3000], pad=PAD))
        assert 0 < wide_tokens() - before <= 40


@wide
@pytest.mark.parametrize(
    ("text", "read"),
    [
        # A wide run starts after a quick run's first token, and each window takes its
        # tokens up to its first other byte; "-0" (the integer 0) refuses a window.
        ("[" + ",".join(["1.25"] * 40) + "]", 38),
        ("[" + ", ".join(["1.25"] * 40) + "]", 1),
        ("[" + ",".join(["1.25", "-0"] + ["1.25"] * 38) + "]", 0),
        ("[" + ",".join(["1.25", "01"] + ["1.25"] * 38) + "]", 0),
        ("[" + ",".join(["1.25", "1.2.5"] + ["1.25"] * 38) + "]", 0),
        ("[" + ",".join(["1.25", "1234567890123456"] + ["1.25"] * 38) + "]", 0),
        ("[" + ",".join(["1.25", "-0.5", "0.125", "-12.5"] * 10) + "]", 38),
        # More tokens than an AVX-512 window takes (eight): the next window goes on.
        ("[" + ",".join(["7"] * 40) + "]", 38),
        # 15 digits and a point: the AVX2 window reads it as a long decimal (over 15
        # characters, long_window), the AVX-512 one counts digits alone.
        ("[" + ",".join(["1.25", "-1.23456789012345"] + ["1.25"] * 38) + "]", 38),
    ],
)  # fmt: skip
@pytest.mark.parametrize("windows", WINDOWS)
def test_wide_windows_take_only_quick_tokens(text, read, windows):
    expected = read[windows] if isinstance(read, dict) else read
    with wide_runs(True, windows):
        before = wide_tokens()
        same_outcome(request_text(text, "FP32", [40], pad=PAD))
        assert wide_tokens() - before == expected


# --------------------------------------------------------------------------- integers


@PROPERTY
@given(
    values=st.lists(
        st.integers(-(2**63), 2**63) | st.integers(-300, 300) | st.integers(-(2**70), 2**70),
        min_size=1,
        max_size=40,
    ),
    datatype=st.sampled_from(INT_TYPES + FLOAT_TYPES),
    sep=separators,
)
def test_integer_lists_decode_as_orjson_and_numpy(values, datatype, sep):
    body = request_text("[" + sep.join(map(str, values)) + "]", datatype, [len(values)])
    outcome = same_outcome(body)
    if outcome[0] == "ok" and all(abs(v) < 10**15 for v in values):
        assert isinstance(engaged(body)[0].values, np.ndarray)


@PROPERTY
@given(
    values=st.lists(st.booleans(), min_size=1, max_size=40),
    datatype=st.sampled_from(["BOOL", "FP32", "INT8"]),
    sep=separators,
)
def test_booleans_decode_as_orjson_and_numpy(values, datatype, sep):
    body = request_text("[" + sep.join(orjson.dumps(v).decode() for v in values) + "]",
                        datatype, [len(values)])  # fmt: skip
    outcome = same_outcome(body)
    if datatype == "BOOL":
        assert outcome[0] == "ok" and isinstance(engaged(body)[0].values, np.ndarray)


# --------------------------------------------------------------------------- shapes


@st.composite
def nested_requests(draw: st.DrawFn) -> tuple[bytes, bool]:
    """Data nested as some dims, declared as those, flat, or another shape; sometimes
    made ragged. Also says whether the nesting is regular."""
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    count = int(np.prod(dims))
    # Numbers the scanner converts itself (Clinger's path or Eisel-Lemire): a batch mostly
    # of subnormals would be left to orjson whatever its nesting (SLOW_TRIAL), and the
    # number forms have tests of their own above.
    numbers = st.integers(-50, 50) | st.floats(-1e6, 1e6, allow_subnormal=False)
    tokens = [str(draw(numbers)) for _ in range(count)]
    seps = iter(draw(st.lists(separators, min_size=count, max_size=count)))
    text = nest(tokens, dims, seps)
    regular = True
    if draw(st.booleans()) and len(dims) > 1:
        # Ragged: one more value in the first row of the innermost level.
        text = text.replace("]", f", {tokens[0]}]", 1)
        regular = False
    declared = draw(
        st.sampled_from([dims, [count], [count + 1], list(reversed(dims)), [count, 1], []])
    )
    datatype = draw(st.sampled_from(["FP32", "FP64", "INT32", "INT64"]))
    return request_text(text, datatype, declared, draw(st.booleans())), regular


@PROPERTY
@given(nested_requests())
def test_nested_data_decodes_as_orjson_and_numpy(case):
    body, _regular = case
    outcome = same_outcome(body)
    if outcome[0] == "ok":
        assert 0 in engaged(body)


@pytest.mark.parametrize(
    "data",
    ["[]", "[[]]", "[[], []]", "[[1], []]", "[[1, 2], [3]]", "[1, [2]]", "[[1], 2]",
     "[[[1]], [2]]", "[[1], [[2]]]", "[[[[[[1]]]]]]", "[" * 33 + "1" + "]" * 33,
     "[" * 100_000 + "]" * 100_000],
)  # fmt: skip
@pytest.mark.parametrize("shape", [[0], [1], [2], [1, 1], [2, 1], [1, 1, 1, 1, 1, 1]])
def test_odd_nestings_decode_as_orjson_and_numpy(data, shape):
    same_outcome(request_text(data, "FP32", shape))


def test_nesting_over_the_depth_limit_is_the_decoders_error(small_depth):
    body = request_text("[[[1]]]", "FP32", [1])
    assert same_outcome(body)[0] == "error"
    assert same_outcome(request_text("[[1]]", "FP32", [1]))[0] == "ok"


@pytest.fixture
def small_depth() -> Iterator[None]:
    before = limits.current()
    limits.configure(limits.DecodeLimits(max_json_depth=5))  # data at most 2 deep
    yield
    limits.configure(before)


# --------------------------------------------------------------------------- anything


scalars = (
    number_tokens()
    | st.sampled_from(["true", "false", "null", '"a"', '""', "NaN", "Infinity", "-Infinity",
                       "-NaN", "{}", '{"a": 1}', "[]", "[1]", "1.", ".5", "+1", "01", "-",
                       "1e", "tru", "0x10", "1_000", "\u00a0"])
)  # fmt: skip


@PROPERTY
@given(
    tokens=st.lists(scalars, min_size=0, max_size=12),
    datatype=st.sampled_from(DATATYPES),
    shape=st.lists(st.integers(0, 13), max_size=2),
    sep=separators,
    data_first=st.booleans(),
)
def test_any_data_decodes_as_orjson_and_numpy(tokens, datatype, shape, sep, data_first):
    same_outcome(request_text("[" + sep.join(tokens) + "]", datatype, shape, data_first))


@st.composite
def inputs_lists(draw: st.DrawFn) -> bytes:
    """Several inputs, some the scanner reads and some it cannot, some in error."""
    tensors = []
    for index in range(draw(st.integers(1, 4))):
        count = draw(st.integers(0, 5))
        tokens = [draw(scalars) for _ in range(count)]
        datatype = draw(st.sampled_from([*DATATYPES, "FP33"]))
        shape = draw(st.sampled_from([[count], [count + 1], [1, count], "[-1]", '"x"']))
        fields = [
            f'"name": "in{index}"',
            f'"datatype": "{datatype}"',
            f'"shape": {shape}',
            f'"data": [{", ".join(tokens)}]',
        ]
        extra = draw(st.sampled_from(['', '"parameters": {"a": [1, 2]}', '"data": [1]',
                                      '"d\\u0061ta": [2]', '"shape": [1]']))  # fmt: skip
        if extra:
            fields.append(extra)
        order = draw(st.permutations(fields))
        tensors.append("{" + ", ".join(order) + "}")
    top = draw(st.sampled_from(['', ', "id": 5', ', "inputs": []', ', "inp\\u0075ts": []',
                                ', "parameters": {"inputs": [{"data": [1]}]}']))  # fmt: skip
    return ('{"inputs": [' + ", ".join(tensors) + "]" + top + "}").encode()


@PROPERTY
@given(inputs_lists())
@example(b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1, 2]}, '
         b'{"name": "b", "datatype": "FP33", "shape": [1], "data": [1e999]}]}')  # fmt: skip
@example(b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1, 2]}, '
         b'{"name": "b", "datatype": "FP32", "shape": [1], "data": [NaN]}]}')  # fmt: skip
def test_several_inputs_decode_as_orjson_and_numpy(body):
    same_outcome(body)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> bytes:
    """A valid request with one byte cut, added or changed, or truncated."""
    values = draw(st.lists(st.floats(-1e3, 1e3) | st.integers(-9, 9), min_size=1, max_size=8))
    body = request_text(orjson.dumps(values).decode(), "FP64", [len(values)], draw(st.booleans()))
    at = draw(st.integers(0, len(body)))
    change = draw(st.sampled_from(["truncate", "delete", "insert", "replace"]))
    byte = draw(st.sampled_from([*b'[]{},:"-.eE0123456789 xNItfn\\', 0, 0xFF]))
    if change == "truncate":
        return body[:at]
    if change == "delete":
        return body[:at] + body[at + 1 :]
    if change == "insert":
        return body[:at] + bytes([byte]) + body[at:]
    return body[:at] + bytes([byte]) + body[at + 1 :]


@PROPERTY
@given(mutated_bodies())
def test_malformed_bodies_fail_as_orjson_and_numpy(body):
    same_outcome(body)


# --------------------------------------------------------------------------- examples


def test_the_scanner_reads_data_and_leaves_the_rest_to_orjson():
    body = request_text("[[1.5, -0.0], [2, 3e2]]", "FP32", [2, 2])
    skeleton, found = json_scan.scan(body, limits.current(), 61)
    assert orjson.loads(skeleton)["inputs"][0]["data"] == 0
    assert found[0].shape == (2, 2) and found[0].datatype == "FP32"
    (tensor,) = rest_json.decode_request(body).inputs
    assert tensor.data.tolist() == [[1.5, -0.0], [2.0, 300.0]]
    assert np.signbit(tensor.data[0, 1])


@pytest.mark.parametrize(
    "body",
    [
        # A repeated or escaped key: orjson keeps the last, the scanner leaves the tensor.
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "data": [2]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], '
        b'"d\\u0061ta": [2]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1], "shape": [1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], '
        b'"datatype": "INT8"}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP\\u0033\\u0032", "shape": [1], "data": [1]}]}',
        b'{"inputs": [], "inp\\u0075ts": [{"name": "x", "datatype": "FP32", "shape": [1], '
        b'"data": [1]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], '
        b'"inputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [2]}]}',
    ],
)
def test_repeated_and_escaped_keys_decode_as_orjson(body):
    outcome = same_outcome(body)
    assert outcome[0] == "ok"


@pytest.mark.parametrize(
    ("data", "datatype"),
    [("[1.0, NaN, -Infinity]", "FP32"), ("[NaN, Infinity]", "FP64"), ("[1, NaN]", "INT32")],
)
def test_nan_and_infinity_literals_take_the_standard_library_path(data, datatype):
    outcome = same_outcome(request_text(data, datatype, [len(data.split(","))]))
    if datatype != "INT32":
        assert outcome[0] == "ok"


def test_the_scanner_checks_the_header_it_read_against_the_document():
    data = json_scan.ScannedData("FP32", (2,), np.zeros(2, np.float32))
    with pytest.raises(json_scan.StaleScan):
        json_scan.values_for(data, "FP64", (2,), 2, "x")
    with pytest.raises(json_scan.StaleScan):
        json_scan.values_for(data, "FP32", (1, 2), 2, "x")
    short = json_scan.ScannedData("FP32", (3,), 2)
    with pytest.raises(BadRequest, match=r"input 'x': shape \[3\] needs 3 values, got 2"):
        json_scan.values_for(short, "FP32", (3,), 3, "x")


# --------------------------------------------------------------------------- hostile


def test_ten_million_values_for_a_small_shape_are_a_400_without_a_big_allocation():
    body = request_text("[" + "0," * (10**7 - 1) + "0]", "FP32", [2, 2])
    tracemalloc.start()
    try:
        with pytest.raises(BadRequest, match=r"needs 4 values, got 10000000$"):
            rest_json.decode_request(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # orjson would build a list of 10 million ints (~360 MB)


@pytest.mark.parametrize("depth", [62, 2000, 500_000])
def test_deep_nesting_is_a_clear_400(depth):
    body = request_text("[" * depth + "1" + "]" * depth, "FP32", [1])
    with pytest.raises(BadRequest, match=r"nested deeper|not valid JSON"):
        rest_json.decode_request(body)
    same_outcome(body)


@pytest.mark.parametrize("cut", [1, 30, 60, 75, 100, -3, -2, -1])
def test_truncated_bodies_are_a_clear_400(cut):
    body = request_text("[" + ", ".join(["1.25"] * 30) + "]", "FP32", [30])
    with pytest.raises(BadRequest, match="not valid JSON"):
        rest_json.decode_request(body[:cut])


def test_the_scanner_allocates_no_more_than_the_limits_admit():
    before = limits.current()
    limits.configure(limits.DecodeLimits(max_tensor_elements=100, max_request_tensor_bytes=600))
    try:
        small = request_text("[" + ",".join(["1"] * 100) + "]", "FP32", [100])
        assert 0 in engaged(small)
        big = request_text("[" + ",".join(["1"] * 101) + "]", "FP32", [101])
        assert engaged(big) == {}
        assert same_outcome(big)[0] == "error"
        # Two tensors of 400 bytes: the second is over the request's 600 bytes.
        two = (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [100], "data": [%s]}, '
            b'{"name": "b", "datatype": "FP32", "shape": [100], "data": [%s]}]}'
        ) % ((b",".join([b"1"] * 100),) * 2)
        assert list(engaged(two)) == [0]
        assert same_outcome(two) == ("error", "TooLarge", same_outcome(two)[2])
    finally:
        limits.configure(before)
