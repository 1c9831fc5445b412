"""tests/huggingface needs transformers and torch, which only tox's huggingface environment
installs (a CPU torch): elsewhere its modules, which import them, are not collected."""

from __future__ import annotations

import importlib.util

INSTALLED = all(importlib.util.find_spec(name) for name in ("torch", "transformers", "tokenizers"))
collect_ignore_glob = [] if INSTALLED else ["test_*.py"]
