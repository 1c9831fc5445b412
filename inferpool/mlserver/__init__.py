"""A compatibility layer for runtimes written against MLServer's Python API.

A custom runtime that imports ``mlserver`` runs under inferpool after changing only its
import lines: ``from mlserver import MLModel`` → ``from inferpool.mlserver import MLModel``,
``mlserver.codecs`` → ``inferpool.mlserver.codecs``, ``mlserver.types`` →
``inferpool.mlserver.types``, ``mlserver.settings`` → ``inferpool.mlserver.settings``,
``mlserver.utils`` → ``inferpool.mlserver.utils``, ``mlserver.errors`` →
``inferpool.mlserver.errors``; ``import mlserver`` → ``import inferpool.mlserver as mlserver``
keeps ``mlserver.register``/``mlserver.log`` (custom metrics). The names and behaviour are
MLServer 1.7.1's; inferpool serves such a model with ``inferpool.runtimes.mlmodel``.
"""

from inferpool.mlserver.metrics import log, register
from inferpool.mlserver.model import MLModel
from inferpool.mlserver.settings import ModelSettings

__all__ = ["MLModel", "ModelSettings", "log", "register"]
