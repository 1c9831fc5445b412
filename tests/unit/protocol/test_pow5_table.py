"""The powers of five of the JSON scanner's Eisel-Lemire conversion (pow5_table.py): the
header the C code includes is the generator's, and each entry is 5^q to 128 bits."""

from __future__ import annotations

from fractions import Fraction

import pytest

from inferpool.protocol import pow5_table


def test_the_header_is_what_the_generator_writes():
    assert pow5_table.HEADER.read_text() == pow5_table.render()


@pytest.mark.parametrize("q", [-342, -300, -28, -27, -26, -1, 0, 1, 27, 55, 56, 300, 308])
def test_an_entry_is_5_to_the_q_in_128_bits(q):
    value = pow5_table.significand(q)
    assert value.bit_length() == 128  # the top bit set
    # 5^q scaled by the power of two that puts it in [2^127, 2^128).
    if q >= 0:
        scaled = Fraction(5**q) * Fraction(2) ** (128 - (5**q).bit_length())
    else:
        scaled = Fraction(2 ** ((5**-q).bit_length() + 127), 5**-q)
    assert 2**127 <= scaled < 2**128
    floor = scaled.numerator // scaled.denominator
    if q >= 0:
        assert value == floor  # truncated (exact up to 5^55)
    elif q >= -27:
        assert value == floor + 1  # rounded up
    else:
        assert value in (floor, floor + 1)
