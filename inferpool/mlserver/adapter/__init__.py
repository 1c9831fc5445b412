"""Serving an MLServer custom runtime (an ``MLModel`` subclass, of ``mlserver`` or of
``inferpool.mlserver``) as an inferpool runtime.

- ``runtime``: the ``Runtime`` subclass built per model class (``adapter_for``), its
  event loop, requests and answers in the model's own types;
- ``batch``: adaptive batching as MLServer applies it (join the requests, split the answer).

The runtime registry (``runtimes/registry.py``) imports ``runtime`` when a custom
``implementation`` is no ``inferpool.Runtime`` but an ``MLModel``.
"""
