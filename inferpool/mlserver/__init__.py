"""MLServer compatibility, gathered: MLServer's Python API for custom runtimes, the adapter
that serves them, and MLServer's settings contract.

The public API. A custom runtime that imports ``mlserver`` runs under inferpool after
changing only its import lines: ``from mlserver import MLModel`` →
``from inferpool.mlserver import MLModel``, ``mlserver.codecs`` → ``inferpool.mlserver.codecs``,
``mlserver.types`` → ``inferpool.mlserver.types``, ``mlserver.settings`` →
``inferpool.mlserver.settings``, ``mlserver.utils`` → ``inferpool.mlserver.utils``,
``mlserver.errors`` → ``inferpool.mlserver.errors``; ``import mlserver`` →
``import inferpool.mlserver as mlserver`` keeps ``mlserver.register``/``mlserver.log``
(custom metrics). The names and behaviour are MLServer 1.7.1's.

The layout:

- ``model``, ``types``, ``settings``, ``errors``, ``utils``, ``metrics``, ``codecs/``: the
  API above (MLServer's ``mlserver.*`` modules of the same names);
- ``adapter/``: serves an ``MLModel`` subclass (MLServer's or this one) as an inferpool
  runtime, batching included (worker and template processes);
- ``contract/``: MLServer's ``settings.json``, ``model-settings.json`` and ``MLSERVER_*``
  variables, mapped to inferpool's settings or refused (every process; below
  ``inferpool.settings``).

This module loads its names when first asked (PEP 562): every process imports
``contract/`` through the settings, and must not load the API (pydantic types, pandas
codecs) with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferpool.mlserver.metrics import log, register
    from inferpool.mlserver.model import MLModel
    from inferpool.mlserver.settings import ModelSettings

__all__ = ["MLModel", "ModelSettings", "log", "register"]

# name -> the module that defines it
_EXPORTS = {
    "MLModel": "inferpool.mlserver.model",
    "ModelSettings": "inferpool.mlserver.settings",
    "log": "inferpool.mlserver.metrics",
    "register": "inferpool.mlserver.metrics",
}
# ``import mlserver; mlserver.codecs.NumpyCodec`` works in MLServer: its package imports them.
_SUBMODULES = frozenset({"codecs", "errors", "metrics", "model", "settings", "types", "utils"})


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
