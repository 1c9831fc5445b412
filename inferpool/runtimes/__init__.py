"""Runtimes: one class per model library, behind the ``Runtime`` interface."""

from inferpool.runtimes.base import Runtime

__all__ = ["Runtime"]
