"""Contributions of the linear kernel's models (``linear.py``): each feature's coefficient
times its distance from a reference row, the bias being the score at the reference.

The score explained is the decision function: a regressor's value, a classifier's
``decision_function`` (log-odds of a logistic regression). It is a sum over the columns
the estimator sees, ``z(x) @ coef + intercept``, so ``coef_j * (z(x)_j - z(ref)_j)``
added over j, plus the score at ``ref``, is the score exactly (to rounding), whatever
``z`` does to a column on its own:

- the scalers before the estimator (StandardScaler, MinMaxScaler, clipped or not) act
  column by column, so the contributions are already in the pipeline's input features;
- a OneHotEncoder's columns are summed back to the feature they encode.

The reference row is the training mean when the model keeps it (the first step's
StandardScaler ``mean_``), else zeros: a plain linear model or a MinMaxScaler keeps no
mean, and then the bias is the intercept (the score at 0). For a one-hot encoded feature
the reference is "no category" (all its columns 0), so its contribution is the
coefficient of the row's category.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.runtimes.linear import CompiledLinear
from inferpool.runtimes.linear_steps import Standardise
from inferpool.runtimes.tabular import numeric_matrix


def reference_row(compiled: CompiledLinear) -> np.ndarray:
    """The row contributions are measured from (see the module's docstring)."""
    first = compiled.scalers[0] if compiled.scalers else None
    if isinstance(first, Standardise):
        return np.broadcast_to(first.center, (compiled.n_features,)).astype(np.float64)
    return np.zeros(compiled.n_features)


def linear_contributions(compiled: CompiledLinear, payload: Any) -> np.ndarray | None:
    """rows x scores x (features + 1) (one score column for a regressor of one target or
    a binary classifier), the bias last; None when the payload is not numbers or holds a
    category the encoder refuses."""
    numbers = numeric_matrix(payload, compiled.n_features)
    if numbers is None:
        return None
    matrix = numbers.astype(np.float64)  # a copy: the scalers work in place
    coef = compiled.coef_t.astype(np.float64).reshape(compiled.coef_t.shape[0], -1)
    intercept = np.broadcast_to(
        np.asarray(compiled.intercept, np.float64).reshape(-1), (coef.shape[1],)
    )
    rows, n_scores = matrix.shape[0], coef.shape[1]
    out = np.empty((rows, n_scores, compiled.n_features + 1))
    if compiled.one_hot is not None:
        codes = compiled.one_hot.encode(matrix)
        if codes is None:
            return None
        columns, known = codes
        # coef[columns] is rows x features x scores: each row's category coefficients.
        picked = np.where(known[:, :, np.newaxis], coef[columns], 0.0)
        out[:, :, :-1] = picked.transpose(0, 2, 1)
        out[:, :, -1] = intercept
        return out
    reference = reference_row(compiled)
    scaled = _scaled(compiled, matrix)
    at_reference = _scaled(compiled, reference[np.newaxis, :].copy())
    # (rows x features x 1) * (features x scores): each feature's share of each score.
    shares = (scaled - at_reference)[:, :, np.newaxis] * coef[np.newaxis, :, :]
    out[:, :, :-1] = shares.transpose(0, 2, 1)
    out[:, :, -1] = at_reference[0] @ coef + intercept
    return out


def _scaled(compiled: CompiledLinear, matrix: np.ndarray) -> np.ndarray:
    for step in compiled.scalers:
        matrix = step(matrix)  # each scaler works in place, on this float64 copy
    return matrix
