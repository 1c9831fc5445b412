"""Builds inferpool's C extensions; the rest of the packaging is in pyproject.toml.

- The tree-ensemble kernel is ``optional``: without a C compiler inferpool still installs,
  and tree models are predicted by their own library (inferpool/runtimes/trees/__init__.py).
- The ring's acquire/release counters (inferpool/engine/ipc/_atomics.c) are ``optional``
  too, for x86-64 alone: its store order makes plain loads and stores exact there
  (inferpool/engine/ipc/atomics.py). On any other CPU (arm64) the worker pool refuses to
  start without them, saying why.
- The JSON tensor scanner (inferpool/protocol/_jsonscan.c, one translation unit including
  inferpool/protocol/jsonscan/*.h) is ``optional``: without it a REST JSON request's data
  is parsed by orjson alone (inferpool/protocol/json_scan.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "inferpool.runtimes.trees._kernel",
            sources=["inferpool/runtimes/trees/_kernel.c"],
            depends=["inferpool/runtimes/trees/oblivious.h"],  # included by _kernel.c
            optional=True,
        ),
        Extension(
            "inferpool.engine.ipc._atomics",
            sources=["inferpool/engine/ipc/_atomics.c"],
            optional=True,
        ),
        Extension(
            "inferpool.protocol._jsonscan",
            sources=["inferpool/protocol/_jsonscan.c"],
            # One translation unit: a change to any of its headers rebuilds it.
            depends=[
                "inferpool/protocol/_pow5.h",
                "inferpool/protocol/jsonscan/common.h",
                "inferpool/protocol/jsonscan/numbers.h",
                "inferpool/protocol/jsonscan/dispatch.h",
                "inferpool/protocol/jsonscan/tier_ssse3.h",
                "inferpool/protocol/jsonscan/tier_avx2.h",
                "inferpool/protocol/jsonscan/tier_avx512.h",
                "inferpool/protocol/jsonscan/scan_generic.h",
            ],
            optional=True,
        ),
    ]
)
