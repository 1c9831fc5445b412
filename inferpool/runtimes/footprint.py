"""How many bytes a loaded model holds: its footprint, for placement and memory reports.

``model_footprint`` walks the loaded model's object graph (``gc.get_referents``), counting
each object once (by id) with ``sys.getsizeof``, and adds what Python cannot see: the
native memory of the model libraries' objects found on the way (``NATIVE_SIZES``) and the
runtime's own ``native_bytes()`` (a custom runtime that holds memory of its own).

The figure is the size of the loaded objects, not a difference of RSS readings, so it is
the same on every load of the same artefact, in any process (an RSS delta also counts
what the allocator kept from loading, imports, and pages touched meanwhile by other
threads). What the walk leaves out, because the whole interpreter shares it: modules,
classes, functions, code objects and loggers (and so anything only they reach), the singletons
(None, True, False, empty tuple and string, the cached small ints), and strings that look
like identifiers (CPython interns attribute names and code constants; pickle interns the
attribute names of the objects it restores).

Native estimates (each cheap to ask of the loaded model): scikit-learn's ``Tree`` holds
its nodes and values in C arrays (``capacity`` nodes of ``NODE_DTYPE`` plus
``n_outputs × max_n_classes`` doubles each); a LightGBM or XGBoost ``Booster`` is its
number of tree nodes (twice its splits, counted by its feature importance, plus one per
tree) times the bytes a loaded node takes (measured; the constants below).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import sys
import types
from collections.abc import Callable
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from inferpool.engine.worker.model import LoadedModel

# Objects that stand for definitions, shared by the whole interpreter: never counted,
# nor anything reached only through them.
_DEFINITIONS = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.CodeType,
    types.FrameType,
    np.dtype,
    np.ufunc,
    # A logger reaches every logger of the process (its manager): not the model's.
    logging.Logger,
)
_SINGLETONS = frozenset(map(id, (None, True, False, Ellipsis, NotImplemented, (), "", b"")))
# CPython's cached small ints.
_SMALL_INTS = range(-5, 257)


def _sklearn_tree(tree: Any) -> int:
    import sklearn.tree._tree as sklearn_tree

    per_node = int(sklearn_tree.NODE_DTYPE.itemsize) + 8 * tree.n_outputs * tree.max_n_classes
    return int(tree.capacity * per_node)


# Bytes per tree node (inner or leaf) of a loaded Booster, measured here as the RSS growth
# of a load less the Python objects' bytes, on models of several shapes. LightGBM 4.7:
# 33-44 for a bare Booster, 48-55 once served (its predictions keep state), more for deep
# trees: 40 trees of 1,023 leaves, served (tests/unit/runtimes/test_footprint.py), grew RSS
# by 7.8-8.3 MiB where 52 bytes a node made a footprint of 6.2 MiB (0.75-0.80 of it, in CI
# and here); XGBoost 3.2: 56-65 for a bare Booster.
LIGHTGBM_NODE_BYTES = 60
XGBOOST_NODE_BYTES = 60


def _lightgbm_booster(booster: Any) -> int:
    # A tree has one more leaf than it has splits; the split counts are a cheap C call.
    splits = int(booster.feature_importance("split").sum())
    trees: int = booster.num_trees()
    return (2 * splits + trees) * LIGHTGBM_NODE_BYTES


def _xgboost_booster(booster: Any) -> int:
    config = json.loads(booster.save_config())["learner"]["gradient_booster"]
    trees = _find(config, "gbtree_model_param")
    if trees is None:  # gblinear: a vector of weights, as long as its raw model
        return len(bytes(booster.save_raw("ubj")))
    splits = int(sum(booster.get_score(importance_type="weight").values()))
    return (2 * splits + int(trees["num_trees"])) * XGBOOST_NODE_BYTES


def _find(config: dict[str, Any], key: str) -> Any:
    """``config[key]``, or in a nested booster's config (DART nests gbtree's)."""
    if key in config:
        return config[key]
    for value in config.values():
        if isinstance(value, dict) and (found := _find(value, key)) is not None:
            return found
    return None


#: native bytes of library objects whose memory Python cannot see, by ``module.Class``
#: of their type (names, so that a library that is not imported costs nothing here)
NATIVE_SIZES: dict[str, Callable[[Any], int]] = {
    "sklearn.tree._tree.Tree": _sklearn_tree,
    "lightgbm.basic.Booster": _lightgbm_booster,
    "xgboost.core.Booster": _xgboost_booster,
}


def model_footprint(model: LoadedModel) -> int:
    """The bytes a loaded model holds: its objects plus their native memory."""
    return object_bytes(model) + model.runtime.native_bytes()


def object_bytes(root: object) -> int:
    """The bytes of every object reachable from ``root`` (each once), plus the native
    memory of the library objects among them (``NATIVE_SIZES``)."""
    seen: set[int] = set()
    total = 0
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or _shared(obj):
            continue
        seen.add(id(obj))
        if type(obj) is dict:
            # An instance's __dict__ may share its keys with the class's other instances,
            # which makes its getsizeof depend on what was loaded before: count it as a
            # dict of its own of that many items.
            total += _dict_bytes(len(obj))
        else:
            total += sys.getsizeof(obj)
        if isinstance(obj, np.ndarray):
            # Not tracked by gc: its data is counted by getsizeof when it owns it, else
            # through its base (another array, bytes, an mmap), reached once.
            if obj.base is not None:
                stack.append(obj.base)
            if obj.dtype.hasobject:
                stack.extend(obj.ravel(order="K").tolist())
            continue
        if isinstance(obj, PurePath):
            # Its string form, not its slots: a path caches its parts and hash when first
            # compared or hashed, which depends on what the process did with it.
            total += sys.getsizeof(str(obj))
            continue
        kind = type(obj)
        native = NATIVE_SIZES.get(f"{kind.__module__}.{kind.__qualname__}")
        if native is not None:
            total += native(obj)
        stack.extend(gc.get_referents(obj))
    return total


@functools.cache
def _dict_bytes(items: int) -> int:
    return sys.getsizeof(dict.fromkeys(range(items)))


def _shared(obj: object) -> bool:
    """Held by the whole interpreter rather than by a model."""
    if id(obj) in _SINGLETONS:
        return True
    kind = type(obj)
    if kind is int:
        return obj in _SMALL_INTS
    if isinstance(obj, str) and kind is str:
        return len(obj) == 1 or obj.isidentifier()
    definition = _IS_DEFINITION.get(kind)
    if definition is None:
        definition = _IS_DEFINITION[kind] = issubclass(kind, _DEFINITIONS)
    return definition


# By type: whether its instances are definitions (``_DEFINITIONS``); asked once per type.
_IS_DEFINITION: dict[type, bool] = {}
