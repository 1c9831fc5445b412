"""The benchmark's catboost and onnx models (``benchmarks/models.py``) and ``python -m
benchmarks inprocess``: the CatBoost model is served by the tree kernel and timed against
CatBoost's predict, the ONNX model (LightGBM converted) answers as LightGBM's labels, and
the catboost and onnx profiles measure both models at batch 1 and 256 over REST and gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.__main__ import main
from benchmarks.models import N_TREES, SEED, _classification, build_repository, load_predictor
from benchmarks.scenarios import PROFILES

pytest.importorskip("catboost")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxmltools")


def test_the_models_answer_and_inprocess_times_every_side(tmp_path, capsys):
    repo = build_repository(tmp_path, ["catboost", "onnx"])
    import catboost
    import lightgbm

    x, y = _classification()
    rows = x[:64]
    again = lightgbm.LGBMClassifier(n_estimators=N_TREES, random_state=SEED, n_jobs=1, verbose=-1)
    want = again.fit(x, y).predict(rows)
    assert np.array_equal(load_predictor(repo, "onnx")(rows), want)  # the converted model
    served = catboost.CatBoostClassifier().load_model(str(repo / "catboost" / "model.cbm"))
    assert served.tree_count_ == N_TREES
    assert np.array_equal(load_predictor(repo, "catboost")(rows), served.predict(rows))
    argv = ["inprocess", "--batch", "1,8", "--rounds", "1", "--budget", "0.01", "--repo", str(repo)]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| model | batch | side | calls/s | rows/s |")
    sides = {tuple(cell.strip() for cell in line.split("|")[1:4]) for line in table[2:]}
    assert sides == {
        (model, batch, side)
        for batch in ("1", "8")
        for model, side in (
            ("catboost", "tree kernel"),
            ("catboost", "CatBoost predict"),
            ("onnx", "InferenceSession.run"),
        )
    }


def test_the_profiles_cover_both_batches_and_protocols():
    for name, peer in (("catboost", "mlserver-w0"), ("onnx", "inferpool-w0")):
        profile = PROFILES[name]
        assert profile.baseline == peer
        cells = {(s.model, s.batch, s.protocol) for s in profile.scenarios}
        assert cells == {
            (name, batch, protocol) for batch in (1, 256) for protocol in ("rest-json", "grpc-raw")
        }
