"""Builds inferpool's one C extension, the tree-ensemble kernel; the rest of the packaging
is in pyproject.toml. ``optional``: without a C compiler inferpool still installs, and
tree models are predicted by their own library (inferpool/runtimes/trees/__init__.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "inferpool.runtimes.trees._kernel",
            sources=["inferpool/runtimes/trees/_kernel.c"],
            optional=True,
        )
    ]
)
