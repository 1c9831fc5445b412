"""``python -m benchmarks.json_scan_timing`` (issue 44): its two bodies carry the same float32
tensor, in the shortest float32 form and as ``ndarray.tolist()`` writes it, and it times
both."""

from __future__ import annotations

import re

import numpy as np

from benchmarks import json_scan_timing
from inferpool.protocol import rest_json


def test_the_two_bodies_hold_one_tensor_in_two_forms_and_both_are_timed():
    made = json_scan_timing.bodies(4)
    numbers = {name: re.findall(rb"-?\d\.\d+", body) for name, body in made.items()}
    assert max(len(n.lstrip(b"-")) for n in numbers["short"]) <= 12
    assert max(len(n.lstrip(b"-")) for n in numbers["tolist"]) >= 18  # 17 digits
    tensors = [rest_json.decode_request(body).inputs[0].data for body in made.values()]
    assert tensors[0].shape == (4, json_scan_timing.FEATURES)
    assert tensors[0].tobytes() == tensors[1].tobytes()
    best = json_scan_timing.measure(4, number=2, repeat=2)
    assert set(best) == {"short", "tolist"}
    assert all(0 < figure < 1e6 for figures in best.values() for figure in figures.values())
    assert np.isfinite(tensors[1]).all()
