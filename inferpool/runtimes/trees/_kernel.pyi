"""Types of the C extension built from ``_kernel.c`` (the tree kernel's inner loop)."""

import numpy as np

def accumulate(
    nodes: np.ndarray,
    leaves: np.ndarray,
    trees: np.ndarray,
    width: int,
    n_features: int,
    x: np.ndarray,
    out: np.ndarray,
    /,
) -> None: ...
