"""The template preloads each version of a model apart: two versions of one name must not
share (or overwrite) one preloaded copy."""

from __future__ import annotations

from pathlib import Path

from inferpool.engine.worker import preload
from tests.support.runtimes import classification_data, save_pickle


def _document(folder: Path, version: str) -> dict:
    return {
        "name": "iris",
        "implementation": "sklearn",
        "parameters": {"version": version, "uri": str(folder / "model.joblib")},
        "folder": str(folder),
    }


def test_each_version_keeps_its_own_preloaded_copy(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    X, y = classification_data()
    save_pickle(tmp_path / "v1", LogisticRegression(max_iter=500).fit(X, y))
    save_pickle(tmp_path / "v2", DecisionTreeClassifier(random_state=0).fit(X, y))
    documents = [_document(tmp_path / "v1", "1"), _document(tmp_path / "v2", "2")]
    try:
        preload.preload(documents)
        first, second = (preload.preloaded(document) for document in documents)
        assert first is not None and second is not None
        assert first is not second
        assert type(first.runtime.model).__name__ == "LogisticRegression"
        assert type(second.runtime.model).__name__ == "DecisionTreeClassifier"
    finally:
        preload._PRELOADED.clear()
