"""MLServer 1.7.1's own docs/examples/mllib names its runtime ``"mlserver-mllib.MLlibModel"``:
the distribution's name, where MLServer imports a module path (``mlserver_mllib``), so
MLServer cannot load its own example as written. inferpool serves it unchanged
(tests/spark/test_mllib_serving.py::test_mlservers_own_mllib_example_serves_unchanged;
docs/migrating-from-mlserver.md)."""

from __future__ import annotations

import pytest

settings_module = pytest.importorskip("mlserver.settings")


def test_mlserver_cannot_import_its_own_mllib_examples_implementation() -> None:
    settings = settings_module.ModelSettings(
        name="spark-mllib", implementation="mlserver-mllib.MLlibModel"
    )
    with pytest.raises(ValueError, match="No module named 'mlserver-mllib'"):
        settings.implementation  # noqa: B018 (the property imports it)


def test_the_module_name_is_what_mlserver_imports() -> None:
    settings = settings_module.ModelSettings(name="m", implementation="mlserver.MLModel")
    assert settings.implementation.__name__ == "MLModel"
