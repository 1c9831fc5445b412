"""Demo models trained on the fly from scikit-learn's bundled iris dataset (no network)."""

from __future__ import annotations

import tempfile
from pathlib import Path


def build_demo_repository(folder: Path | None = None) -> Path:
    """Train an iris LogisticRegression and RandomForest into a model repository."""
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    root = folder or Path(tempfile.mkdtemp(prefix="inferpool-demo-"))
    X, y = load_iris(return_X_y=True)
    models = {
        "iris-logreg": LogisticRegression(max_iter=1000),
        "iris-rf": RandomForestClassifier(n_estimators=50, random_state=0, n_jobs=1),
    }
    for name, estimator in models.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        joblib.dump(estimator.fit(X, y), root / name / "model.joblib")
    return root
