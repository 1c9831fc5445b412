"""Whether a model is served by one of inferpool's kernels or by its library, and why.

The choice is made once, when the model loads: the model-settings switch
``parameters.extra.tree_kernel`` (default true) must allow it, the importer must take the
model, and the compiled model must pass ``verify``. Otherwise the library predicts; the
note returned with the choice (``Runtime.predictor``, in the load log) says why. A failure
here never fails the model's load. The tree kernel is the usual one; the scikit-learn
runtime's linear kernel (``runtimes/linear.py``) goes through the same choice, under the
same switch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from inferpool.runtimes.trees.forest import Unsupported
from inferpool.runtimes.trees.verify import RTOL, Predict, verify
from inferpool.settings import ModelSettings

SETTING = "tree_kernel"
logger = logging.getLogger("inferpool.runtimes.trees")

Compiled = TypeVar("Compiled")
Outputs = dict[str, tuple[Predict, Predict]]


def kernel_enabled(settings: ModelSettings) -> bool:
    """The model's ``parameters.extra.tree_kernel``: true unless set to false."""
    value = settings.parameters.extra.get(SETTING, True)
    if not isinstance(value, bool):
        raise ValueError(f"parameters.extra.{SETTING} must be true or false, not {value!r}")
    return value


def compile_model(
    settings: ModelSettings,
    library: str,
    build: Callable[[], Compiled],
    checks: Callable[[Compiled], tuple[Outputs, list[Any]]],
    rtol: float = RTOL,
    kernel: str = "tree kernel",
) -> tuple[Compiled | None, str]:
    """``build()``'s compiled model once ``checks`` (outputs to compare, probe rows) pass,
    or None when the library should predict; and what predicts, with the reason.

    ``kernel`` names the kernel in that note. The compiled model's ``describe()`` (or its
    ``forest``'s) says what it holds, in parentheses after the name."""
    if not kernel_enabled(settings):
        return None, f"{library} ({SETTING} is off)"
    try:
        compiled = build()
        outputs, probes = checks(compiled)
        verify(outputs, probes, rtol)
    except Unsupported as exc:
        return None, f"{library}, not the {kernel}: {exc}"
    except Exception as exc:  # a model the importer misreads must still load
        logger.warning("model '%s': %s import failed", settings.name, kernel, exc_info=True)
        return None, f"{library}; the {kernel} could not take it: {type(exc).__name__}: {exc}"
    describe = getattr(compiled, "describe", None)
    if describe is None:
        forest = getattr(compiled, "forest", None)
        describe = forest.describe if forest is not None else None
    shape = f" ({describe()})" if describe is not None else ""
    return compiled, f"the {kernel}{shape}"
