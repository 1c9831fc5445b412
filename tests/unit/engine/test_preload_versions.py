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


def test_each_version_keeps_its_own_preloaded_copy(tmp_path: Path, monkeypatch) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    X, y = classification_data()
    save_pickle(tmp_path / "v1", LogisticRegression(max_iter=500).fit(X, y))
    save_pickle(tmp_path / "v2", DecisionTreeClassifier(random_state=0).fit(X, y))
    documents = [_document(tmp_path / "v1", "1"), _document(tmp_path / "v2", "2")]
    # This pytest process is no template: threads other tests left behind come and go, and
    # one started during a load would read as the load's.
    monkeypatch.setattr(preload, "thread_count", lambda: 1)
    try:
        results, epoch = preload.preload(documents, 0)
        assert [(r.ok, r.epoch) for r in results] == [(True, 1), (True, 2)] and epoch == 2
        first, second = (preload.preloaded(document) for document in documents)
        assert first is not None and second is not None
        assert first[0] is not second[0]
        assert type(first[0].runtime.model).__name__ == "LogisticRegression"
        assert type(second[0].runtime.model).__name__ == "DecisionTreeClassifier"
    finally:
        preload._PRELOADED.clear()
