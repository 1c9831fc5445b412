"""Types of the C extension built from ``_kernel.c`` (the tree kernel's inner loops)."""

import numpy as np

NODE_SIZE: int
TREE_SIZE: int
MAX_THREADS: int

def accumulate(
    nodes: np.ndarray,
    leaves: np.ndarray,
    trees: np.ndarray,
    width: int,
    n_features: int,
    x: np.ndarray,
    out: np.ndarray,
    bits: np.ndarray | None = None,
    threads: int = 1,
    /,
) -> None: ...
def lay_out(
    left: np.ndarray,
    right: np.ndarray,
    feature: np.ndarray,
    threshold: np.ndarray,
    flags: np.ndarray,
    values: np.ndarray,
    n_features: int,
    nodes: np.ndarray,
    leaves: np.ndarray,
    first: int,
    weights: np.ndarray | None = None,
    /,
) -> tuple[int, int]: ...
def contributions(
    nodes: np.ndarray,
    values: np.ndarray,
    trees: np.ndarray,
    width: int,
    n_features: int,
    x: np.ndarray,
    out: np.ndarray,
    bits: np.ndarray | None = None,
    /,
) -> None: ...
def libm(function: int, values: np.ndarray, scale: float = 1.0, /) -> None: ...
def oblivious(
    splits: np.ndarray,
    trees: np.ndarray,
    leaves: np.ndarray,
    width: int,
    n_features: int,
    x: np.ndarray,
    out: np.ndarray,
    threads: int = 1,
    /,
) -> None: ...
