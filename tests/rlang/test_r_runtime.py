"""The R runtime in this process: a model R cannot load or predict is one sentence (an R
package missing, a class no package predicts, no .rds, a file that is no .rds), and an
error R raises while predicting is a 500 with R's message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from inferpool.errors import ModelError, ModelLoadError
from inferpool.settings import ModelSettings
from tests.rlang.r_models import run_r

# Collected by every environment: the runtime is imported by the tests that run (tox -e languages).
pytest.importorskip("rpy2")

LINEAR = """
d <- data.frame(a = c(1, 2, 3, 4), b = c(1, 0, 1, 0))
d$y <- 3 * d$a + d$b
dir.create(file.path(root, "m"))
saveRDS(lm(y ~ a + b, data = d), file.path(root, "m", "model.rds"))
"""


def runtime(folder: Path, **extra: object):
    from inferpool.runtimes.r import RRuntime

    return RRuntime(ModelSettings(name="m", folder=folder, parameters={"extra": extra}))


def test_a_linear_model_answers_as_r(tmp_path: Path) -> None:
    run_r(LINEAR, tmp_path)
    model = runtime(tmp_path / "m")
    before = os.environ.get("LD_LIBRARY_PATH")
    model.load()
    # rpy2 sets R's library folders there for R's children: put back, or every later
    # child of the process (a server's load probe) would load the system's libpython.
    assert os.environ.get("LD_LIBRARY_PATH") == before
    answer = model.predict({"x": np.array([[5.0, 1.0], [0.0, 0.0]])}, ["predict"])["predict"]
    np.testing.assert_allclose(answer, [16.0, 0.0], atol=1e-9)


def test_an_error_in_r_is_a_500_with_rs_message(tmp_path: Path) -> None:
    run_r(LINEAR, tmp_path)
    model = runtime(tmp_path / "m", predict_type="nonsense")  # predict.lm has no such type
    model.load()
    with pytest.raises(ModelError, match=r"model 'm' failed in R: .arg. should be one of") as error:
        model.predict({"x": np.array([[5.0, 1.0]])}, ["predict"])
    assert error.value.status == 500


def test_an_r_package_missing_is_one_sentence(tmp_path: Path) -> None:
    run_r(LINEAR, tmp_path)
    with pytest.raises(ModelLoadError) as error:
        runtime(tmp_path / "m", r_packages=["nosuchpackage"]).load()
    assert str(error.value) == (
        "model.rds needs the R package 'nosuchpackage', which is not installed "
        "(install.packages('nosuchpackage'), or r-cran-nosuchpackage from apt)"
    )


def test_a_model_no_package_predicts_is_one_sentence(tmp_path: Path) -> None:
    source = """
    dir.create(file.path(root, "m"))
    saveRDS(structure(list(), class = "mysteryForest"), file.path(root, "m", "model.rds"))
    """
    run_r(source, tmp_path)
    with pytest.raises(ModelLoadError) as error:
        runtime(tmp_path / "m").load()
    message = str(error.value)
    assert message.startswith(
        "model.rds holds an R 'mysteryForest' model and no R package installed here predicts it"
    )
    assert "\n" not in message


def test_no_rds_is_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "model-settings.json").write_text(json.dumps({"name": "m"}))
    with pytest.raises(FileNotFoundError, match=r"^none of model\.rds in "):
        runtime(folder).load()


def test_a_file_that_is_no_rds_is_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "garbled"
    folder.mkdir()
    (folder / "model.rds").write_bytes(b"certainly not R's serialization")
    sentence = r"^model\.rds is not a valid R model \(unknown input format; "
    with pytest.raises(ModelLoadError, match=sentence) as error:
        runtime(folder).load()
    assert "\n" not in str(error.value)
