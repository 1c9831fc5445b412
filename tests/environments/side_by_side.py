"""inferpool's answers beside MLServer's own, for the alibi runtimes' comparisons
(test_alibi_detect_mlserver.py, test_alibi_explain_mlserver.py): MLServer started from a
virtualenv holding it and its runtime (tests/support/venvs.py), on a repository of its own
whose models load the folders inferpool's repository saved."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np

from tests.support.venvs import venv_from

HERE = Path(__file__).parent


def mlserver_python(runtime: str, *then: str) -> Path:
    """The python of the virtualenv holding MLServer and its ``runtime`` (``alibi-detect``
    or ``alibi-explain``): made from mlserver-<runtime>-requirements.txt, then the files
    ``then`` names, unless a run before made it (tox -e environments makes it before the
    tests)."""
    files = [HERE / f"mlserver-{runtime}-requirements.txt", *(HERE / name for name in then)]
    return venv_from(*files) / "bin" / "python"


def mlserver_model(folder: Path, implementation: str, uri: str, extra: dict) -> None:
    """A model folder for MLServer: its settings, the model's files elsewhere (``uri``)."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "name": folder.name,
        "implementation": implementation,
        "parameters": {"uri": uri, "extra": extra},
    }
    (folder / "model-settings.json").write_text(json.dumps(document))


def both(ours: str, theirs: str, name: str, request: dict) -> tuple[httpx.Response, ...]:
    """The same inference request to inferpool (REST URL ``ours``) and MLServer
    (``theirs``): their two answers, whose statuses must be equal."""
    answers = tuple(
        httpx.post(f"{url}/v2/models/{name}/infer", json=request, timeout=120)
        for url in (ours, theirs)
    )
    statuses = [a.status_code for a in answers]
    assert statuses[0] == statuses[1], (name, answers[0].text, answers[1].text)
    return answers


def assert_same_data(ours: object, theirs: object, rtol: float = 1e-6) -> None:
    """Two tensors' data: equal, floats within ``rtol`` (NaN, JSON's null, equal to NaN)."""
    if _numbers(ours) and _numbers(theirs):
        np.testing.assert_allclose(_floats(ours), _floats(theirs), rtol=rtol, equal_nan=True)
    else:
        assert ours == theirs


def assert_same_outputs(ours: list[dict], theirs: list[dict], skip: tuple = ()) -> None:
    """Each output's name, datatype, shape and data equal; those in ``skip`` (drawn anew by
    each load: an online detector's simulated thresholds) by their name, datatype and shape."""
    assert [o["name"] for o in ours] == [t["name"] for t in theirs]
    for one, other in zip(ours, theirs, strict=True):
        head = ("name", "datatype", "shape")
        assert [one[k] for k in head] == [other[k] for k in head], (one, other)
        if one["name"] not in skip:
            assert_same_data(one["data"], other["data"])


def _flat(data: object) -> list:
    if isinstance(data, list):
        return [value for item in data for value in _flat(item)]
    return [data]


def _numbers(data: object) -> bool:
    return all(v is None or isinstance(v, int | float) for v in _flat(data))


def _floats(data: object) -> list[float]:
    return [math.nan if v is None else float(v) for v in _flat(data)]
