"""inferpool's answers beside MLServer's own, for the alibi runtimes' comparisons
(test_alibi_detect_mlserver.py, test_alibi_explain_mlserver.py): MLServer started from a
virtualenv holding it and its runtime (tests/support/venvs.py), on a repository of its own
whose models load the folders inferpool's repository saved."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

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
