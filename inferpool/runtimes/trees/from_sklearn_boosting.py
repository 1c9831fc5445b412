"""scikit-learn's gradient boosting for the kernel: ``GradientBoostingClassifier`` and
``GradientBoostingRegressor``, ``HistGradientBoostingClassifier`` and
``HistGradientBoostingRegressor``.

Both add, iteration by iteration and class by class, each tree's leaf value to a float64
score that starts from the model's baseline; the kernel adds the same values in the same
order, and scikit-learn's own loss turns the scores into probabilities and values, so
every output is scikit-learn's to the bit.

- GradientBoosting: float32 features against float64 thresholds, as its forests; a leaf
  adds ``learning_rate * value`` (computed once here, as scikit-learn computes it per
  row); the scores start from the init estimator's prediction, which must be a constant
  (``init="zero"`` or the default dummy estimator). Rows holding NaN or infinity are left
  to scikit-learn.
- HistGradientBoosting: float64 features; a NaN follows the node's
  ``missing_go_to_left``, any other value goes left when ``x <= num_threshold``. A model
  with categorical features has scikit-learn's own preprocessor (an ordinal encoder:
  unknown categories and NaN become NaN; the categorical columns first) run on the rows
  before the kernel. Its category split sends a category of its left bitset left, another
  known category right, and NaN or a category unknown to the model (a value rare enough
  to have been left out of the binning sample) the way ``missing_go_to_left`` says: the
  kernel's category split with the unknown categories added to the left set when missing
  values go left.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.runtimes.trees.forest import (
    CATEGORICAL,
    NAN_LEFT,
    Forest,
    ForestBuilder,
    Unsupported,
)
from inferpool.runtimes.trees.from_sklearn import MAX_NODES, payload_rows, tree_arrays
from inferpool.runtimes.trees.verify import probe_rows

GRADIENT_BOOSTING = ("GradientBoostingClassifier", "GradientBoostingRegressor")
HIST_GRADIENT_BOOSTING = ("HistGradientBoostingClassifier", "HistGradientBoostingRegressor")
# The init estimators whose prediction is the same for every row.
CONSTANT_INITS = ("DummyClassifier", "DummyRegressor")


def is_boosting(model: Any) -> bool:
    """Whether ``model`` is one of scikit-learn's gradient-boosting estimators."""
    kind = type(model)
    return kind.__module__.split(".")[0] == "sklearn" and kind.__name__ in (
        GRADIENT_BOOSTING + HIST_GRADIENT_BOOSTING
    )


class CompiledBoosting:
    """``predict`` (and ``predict_proba``, ``decision_function`` of a classifier) of a
    fitted gradient-boosting estimator, from the kernel's scores."""

    def __init__(self, model: Any) -> None:
        name = type(model).__name__
        if not is_boosting(model):
            raise Unsupported(f"{name} is not a gradient-boosting estimator")
        self.model = model
        self.loss = model._loss  # scikit-learn's link: probabilities and values from scores
        self.classes = getattr(model, "classes_", None)
        self.hist = name in HIST_GRADIENT_BOOSTING
        #: HistGradientBoosting's encoder of categorical features (None: it has none)
        self.preprocessor = getattr(model, "_preprocessor", None) if self.hist else None
        self.forest: Forest = _hist_forest(model) if self.hist else _forest(model)

    def rows(self, payload: Any) -> np.ndarray | None:
        """The payload as the kernel's rows, or None to leave it to scikit-learn
        (GradientBoosting: rows holding NaN or infinity)."""
        if self.preprocessor is not None:
            try:
                payload = self.preprocessor.transform(payload)
            except Exception:  # scikit-learn's predict raises its own message for it
                return None
        return payload_rows(payload, self.forest, finite=not self.hist)

    def probes(self) -> list[np.ndarray]:
        """The rows ``verify`` compares the kernel and scikit-learn on: HistGradientBoosting
        in float64 with NaN and infinities, GradientBoosting in float32 finite rows."""
        if not self.hist:
            return [probe_rows(self.forest, np.float32, nonfinite=False)]
        probes = [probe_rows(self.forest), probe_rows(self.forest, np.float32, seed=1)]
        if self.preprocessor is None:
            return probes
        return [_raw_categories(self.model, rows, seed) for seed, rows in enumerate(probes)]

    def _scores(self, rows: np.ndarray) -> np.ndarray:
        return self.forest.accumulate(rows)

    def decision_function(self, rows: np.ndarray) -> np.ndarray:
        scores = self._scores(rows)
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict_proba(self, rows: np.ndarray) -> np.ndarray:
        # GradientBoosting passes the squeezed scores, HistGradientBoosting the 2-D ones.
        scores = self._scores(rows) if self.hist else self.decision_function(rows)
        probabilities: np.ndarray = self.loss.predict_proba(scores)
        return probabilities

    def predict(self, rows: np.ndarray) -> np.ndarray:
        if self.classes is None:
            scores = self._scores(rows).ravel()
            values: np.ndarray = self.loss.link.inverse(scores) if self.hist else scores
            return values
        sums = self._scores(rows)
        if sums.shape[1] > 1:
            encoded = np.argmax(sums, axis=1)
        elif self.hist:  # np.argmax([0, 0]) is 0: a tie is class 0 ("> 0")
            encoded = (sums[:, 0] > 0).astype(int)
        else:
            encoded = (sums[:, 0] >= 0).astype(int)
        labels: np.ndarray = self.classes[encoded]
        return labels

    def methods(self) -> dict[str, Any]:
        """The estimator methods the kernel computes, by name."""
        if self.classes is None:
            return {"predict": self.predict}
        return {
            "predict": self.predict,
            "predict_proba": self.predict_proba,
            "decision_function": self.decision_function,
        }


def _forest(model: Any) -> Forest:
    """A GradientBoosting model's trees: estimators_[iteration, class]."""
    init = model.init_
    if not (isinstance(init, str) and init == "zero") and type(init).__name__ not in CONSTANT_INITS:
        raise Unsupported(f"the init estimator {type(init).__name__} (not a constant)")
    estimators = model.estimators_
    nodes = sum(tree.tree_.node_count for tree in estimators.ravel())
    if nodes > MAX_NODES:
        raise Unsupported(f"{nodes:,} nodes (the kernel takes up to {MAX_NODES:,})")
    n_features = int(model.n_features_in_)
    # The scores' start: the init estimator's prediction, the same for every row.
    start = np.asarray(model._raw_predict_init(np.zeros((1, n_features), np.float32)))
    if start.shape != (1, estimators.shape[1]):
        raise Unsupported(f"an initial prediction of shape {start.shape}")
    builder = ForestBuilder(n_features)
    learning_rate = model.learning_rate
    for stage in estimators:
        for column, estimator in enumerate(stage):
            tree = estimator.tree_
            # scikit-learn adds learning_rate * value to the score: the same product.
            values = learning_rate * tree.value[:, 0, 0]
            weights = tree.weighted_n_node_samples
            builder.add_arrays(*tree_arrays(tree, values), column=column, weights=weights)
    return builder.build(estimators.shape[1], input_dtype=np.float32, start=start[0])


def _hist_forest(model: Any) -> Forest:
    """A HistGradientBoosting model's trees: _predictors[iteration][class]."""
    categorical = _any(model, "is_categorical_")
    if categorical:
        preprocessor = getattr(model, "_preprocessor", None)
        if preprocessor is None:
            raise Unsupported("categorical features without scikit-learn's encoder")
        encoder = preprocessor.named_transformers_["encoder"]
        if any(np.asarray(c).dtype.kind not in "fiu" for c in encoder.categories_):
            raise Unsupported("categories that are not numbers")
    known, known_index = model._bin_mapper.make_known_categories_bitsets()
    predictors = model._predictors
    nodes = sum(len(p.nodes) for iteration in predictors for p in iteration)
    if nodes > MAX_NODES:
        raise Unsupported(f"{nodes:,} nodes (the kernel takes up to {MAX_NODES:,})")
    baseline = np.asarray(model._baseline_prediction, dtype=np.float64).reshape(-1)
    builder = ForestBuilder(int(model.n_features_in_))
    for iteration in predictors:
        for column, predictor in enumerate(iteration):
            tree = predictor.nodes
            leaf = tree["is_leaf"].astype(bool)
            nan_left = tree["missing_go_to_left"].astype(bool)
            flags = np.where(nan_left, NAN_LEFT, 0)
            threshold = tree["num_threshold"].copy()
            for node in np.flatnonzero(tree["is_categorical"].astype(bool) & ~leaf):
                left = _members(predictor.raw_left_cat_bitsets[tree["bitset_idx"][node]])
                if nan_left[node]:  # an unknown category goes as a missing value
                    feature_known = known[known_index[tree["feature_idx"][node]]]
                    left = np.union1d(left, np.setdiff1d(np.arange(256), _members(feature_known)))
                threshold[node] = builder.add_bitset(left)
                flags[node] |= CATEGORICAL
            builder.add_arrays(
                np.where(leaf, -1, tree["left"].astype(np.int64)),  # stored as uint32
                np.where(leaf, -1, tree["right"].astype(np.int64)),
                tree["feature_idx"],
                threshold,
                flags,
                tree["value"],
                column=column,
                weights=tree["count"],
            )
    return builder.build(len(baseline), input_dtype=np.float64, start=baseline)


def _members(bitset: np.ndarray) -> np.ndarray:
    """The categories a scikit-learn bitset (uint32 words, bit c of word c // 32) holds."""
    words = np.ascontiguousarray(bitset, dtype="<u4")
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))


def _raw_categories(model: Any, encoded: np.ndarray, seed: int) -> np.ndarray:
    """Probe rows in the model's input columns from probe rows of its encoded columns
    (categorical first): each categorical column holds the model's categories, values
    it never saw, and NaN."""
    rng = np.random.default_rng(seed)
    mask = np.asarray(model.is_categorical_, dtype=bool)
    order = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])
    rows = np.empty_like(encoded)
    rows[:, order] = encoded
    encoder = model._preprocessor.named_transformers_["encoder"]
    for column, categories in zip(np.flatnonzero(mask), encoder.categories_, strict=True):
        seen = categories[~np.isnan(categories)].astype(encoded.dtype)
        unseen = np.array([np.nan, -1.0, 0.5, 1e9], dtype=encoded.dtype)
        if seen.size:
            unseen = np.concatenate([unseen, [seen.max() + 1, seen.min() - 1]])
        pool = np.concatenate([seen, unseen])
        rows[:, column] = rng.choice(pool, size=len(rows))
    return rows


def _any(model: Any, attribute: str) -> bool:
    value = getattr(model, attribute, None)
    return value is not None and bool(np.any(value))
