"""tests/deploy runs in tox's deploy environment (marker ``deploy``, tests/conftest.py), the
only one with the kserve SDK and kubernetes-validate: elsewhere its test modules, which
import them, are not collected, so that the other runs can deselect the folder."""

from __future__ import annotations

import importlib.util

if any(importlib.util.find_spec(name) is None for name in ("kserve", "kubernetes_validate")):
    collect_ignore_glob = ["test_*.py"]
