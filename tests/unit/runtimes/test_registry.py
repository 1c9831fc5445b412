"""One runtime registry: a runtime's facts live in its entry, and the template and the
preloader read them from there (issue 15, point 8)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.worker import preload as preloader
from inferpool.engine.worker import template
from inferpool.errors import RuntimeNotFound
from inferpool.runtimes import registry
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.registry import RuntimeEntry
from inferpool.settings import ModelSettings

# A runtime that is no part of inferpool, in a module written for each test.
FAKE_RUNTIME = """
from inferpool.runtimes.base import Runtime

LOADS = []


class FakeRuntime(Runtime):
    platform = "fake"

    def load(self):
        LOADS.append(self.name)

    def predict(self, payload, outputs):
        return payload
"""
FAKE_MODULES = ("fake_runtime", "fake_library", "fake_library_missing", "fake_needs_library")


@pytest.fixture
def fake_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``fake_runtime`` (the runtime), ``fake_library`` (a module worth preloading) and
    ``fake_needs_library`` (a runtime module whose library is not installed)."""
    (tmp_path / "fake_runtime.py").write_text(FAKE_RUNTIME)
    (tmp_path / "fake_library.py").write_text("")
    (tmp_path / "fake_needs_library.py").write_text("import fake_library_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)


def fake_entry(**facts: object) -> RuntimeEntry:
    fields: dict[str, Any] = {
        "name": "fake",
        "implementation": "fake_runtime.FakeRuntime",
        "extra": "fake-extra",
        "mlserver": "mlserver_fake.FakeModel",
        "artefacts": ("model.fake",),
        "preload": ("fake_runtime", "fake_library", "fake_library_missing"),
    }
    return RuntimeEntry(**{**fields, **facts})


def only(entry: RuntimeEntry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry holds ``entry`` and nothing else."""
    monkeypatch.setattr(registry, "RUNTIMES", {entry.name: entry})


# -- the built-in entries -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(registry.RUNTIMES))
def test_each_entry_names_its_runtime_class(name: str) -> None:
    settings = ModelSettings(name="m", runtime=name)
    entry = registry.RUNTIMES[name]
    try:
        cls = registry.runtime_class(settings)
    except RuntimeNotFound as exc:
        # A library the default environment does not hold (tox -e runtimes tests them).
        assert str(exc).endswith(f": {entry.how_to_install()}")
        pytest.skip(str(exc))
    assert issubclass(cls, Runtime)
    assert cls.platform == name


@pytest.mark.parametrize("name", [n for n, e in registry.RUNTIMES.items() if e.mlserver])
def test_mlserver_implementation_strings_choose_the_runtime(name: str) -> None:
    entry = registry.RUNTIMES[name]
    settings = ModelSettings(name="m", implementation=entry.mlserver)
    assert registry.runtime_name_for(settings) == name
    # as a distribution's name: MLServer's own mllib example says "mlserver-mllib.MLlibModel"
    distribution = entry.mlserver.replace("_", "-", 1)
    assert "-" in distribution
    settings = ModelSettings(name="m", implementation=distribution)
    assert registry.runtime_name_for(settings) == name


def test_an_unknown_mlserver_runtime_stays_a_custom_implementation() -> None:
    settings = ModelSettings(name="m", implementation="mlserver-nosuch.Model")
    assert registry.runtime_name_for(settings) == "mlserver-nosuch.Model"


def test_tree_runtimes_are_fork_safe_and_mlflow_is_not() -> None:
    safe = {name for name, entry in registry.RUNTIMES.items() if entry.fork_safe}
    assert safe == {"sklearn", "lightgbm", "xgboost", "catboost"}


def test_mlflow_is_never_imported_by_the_template() -> None:
    assert registry.preload_modules(ModelSettings(name="m", runtime="mlflow")) == ()
    sklearn = registry.preload_modules(ModelSettings(name="m", runtime="sklearn"))
    assert "inferpool.runtimes.sklearn" in sklearn


def test_the_template_imports_no_runtime_before_a_model_needs_it() -> None:
    # Every start-up paid for scikit-learn's estimators (1.3 s of CPU) before, whatever the
    # repository held; the engine's modules are what every worker uses.
    assert not [name for name in template.PRELOAD if "runtimes" in name or "sklearn" in name]


def test_a_custom_runtime_preloads_nothing(fake_modules: Path) -> None:
    settings = ModelSettings(name="m", implementation="fake_runtime.FakeRuntime")
    assert registry.preload_modules(settings) == ()


# -- a new runtime is one entry ---------------------------------------------------------------


def test_the_template_imports_an_entry_s_modules_with_its_first_model(
    fake_modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    only(fake_entry(fork_safe=True), monkeypatch)
    monkeypatch.setattr(preloader, "_PRELOADED", {})
    settings = ModelSettings(name="m", runtime="fake")
    assert registry.preload_modules(settings) == (
        "fake_runtime", "fake_library", "fake_library_missing",
    )  # fmt: skip
    assert "fake_library" not in sys.modules
    [result] = preloader.preload([{"name": "m", "runtime": "fake"}], 0)[0]
    assert result.ok  # the missing library is skipped
    assert "fake_runtime" in sys.modules
    assert "fake_library" in sys.modules
    assert "fake_library_missing" not in sys.modules


def test_an_entry_with_no_preload_modules_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    only(fake_entry(preload=()), monkeypatch)
    assert registry.preload_modules(ModelSettings(name="m", runtime="fake")) == ()


@pytest.mark.parametrize("fork_safe", [True, False])
def test_the_template_preloads_a_model_only_if_its_entry_is_fork_safe(
    fake_modules: Path, monkeypatch: pytest.MonkeyPatch, fork_safe: bool
) -> None:
    only(fake_entry(fork_safe=fork_safe), monkeypatch)
    monkeypatch.setattr(preloader, "_PRELOADED", {})
    document = {"name": "m", "runtime": "fake"}
    assert registry.is_fork_safe(ModelSettings(**document)) is fork_safe
    preloader.preload([document], 0)
    copy = preloader.preloaded(document)
    if fork_safe:
        assert copy is not None
        assert copy[0].runtime.platform == "fake"
        assert sys.modules["fake_runtime"].LOADS == ["m"]
    else:
        assert copy is None
        assert "fake_runtime" not in sys.modules  # not even imported


def test_a_custom_runtime_is_not_fork_safe_and_not_imported(fake_modules: Path) -> None:
    settings = ModelSettings(name="m", implementation="fake_runtime.FakeRuntime")
    assert not registry.is_fork_safe(settings)
    assert "fake_runtime" not in sys.modules


def test_the_entry_chooses_the_runtime_from_its_names(
    fake_modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    only(fake_entry(), monkeypatch)
    (fake_modules / "model.fake").write_text("")
    by_artefact = ModelSettings(name="m", folder=fake_modules)
    by_mlserver = ModelSettings(name="m", implementation="mlserver_fake.FakeModel")
    assert registry.runtime_name_for(by_artefact) == "fake"
    assert registry.runtime_name_for(by_mlserver) == "fake"
    assert registry.runtime_class(by_artefact).__name__ == "FakeRuntime"


def test_no_artefact_lists_the_entries_artefacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    only(fake_entry(artefacts=("model.fake", "weights.fake")), monkeypatch)
    with pytest.raises(RuntimeNotFound, match=r"expected one of: model\.fake, weights\.fake"):
        registry.runtime_name_for(ModelSettings(name="m", folder=tmp_path))


def test_a_missing_library_names_the_entry_s_extra(
    fake_modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    only(fake_entry(implementation="fake_needs_library.FakeRuntime"), monkeypatch)
    with pytest.raises(RuntimeNotFound) as caught:
        registry.runtime_class(ModelSettings(name="m", runtime="fake"))
    assert str(caught.value) == (
        "the 'fake' runtime needs fake_library_missing: pip install inferpool[fake-extra]"
    )


def test_an_unknown_name_lists_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    only(fake_entry(), monkeypatch)
    with pytest.raises(RuntimeNotFound, match=r"use one of fake or module\.Class"):
        registry.runtime_class(ModelSettings(name="m", runtime="nothing"))


# -- what the template may load: MLflow flavours, custom runtimes that say so ------------------

MLMODEL = """flavors:
  python_function:
    loader_module: {loader}
    python_version: 3.11.7
"""


@pytest.mark.parametrize(
    ("loader", "safe"),
    [
        ("mlflow.sklearn", True),
        ("mlflow.lightgbm", True),
        ("mlflow.xgboost", True),
        ("mlflow.pyfunc.model", False),  # a PythonModel of the user's: its load_context
        ("mlflow.pytorch", False),
    ],
)
def test_an_mlflow_model_is_fork_safe_by_its_flavour(
    tmp_path: Path, loader: str, safe: bool
) -> None:
    (tmp_path / "MLmodel").write_text(MLMODEL.format(loader=loader))
    settings = ModelSettings(name="m", folder=tmp_path)
    assert registry.is_fork_safe(settings) is safe
    by_uri = ModelSettings(name="m", parameters={"uri": str(tmp_path / "MLmodel")})
    assert registry.is_fork_safe(by_uri) is safe


def test_an_unreadable_mlmodel_is_not_fork_safe(tmp_path: Path) -> None:
    (tmp_path / "MLmodel").write_text("flavors: [not, a, mapping")
    assert not registry.is_fork_safe(ModelSettings(name="m", folder=tmp_path))


SAYS_SAFE = """
import inferpool

LOADED = True


class Safe(inferpool.Runtime):
    fork_safe = True


class Annotated(inferpool.Runtime):
    fork_safe: bool = True


class Unsafe(inferpool.Runtime):
    fork_safe = False


class Silent(Safe):
    pass
"""


@pytest.mark.parametrize(
    ("name", "safe"), [("Safe", True), ("Annotated", True), ("Unsafe", False), ("Silent", False)]
)
def test_a_custom_runtime_is_fork_safe_if_its_class_says_so_and_is_not_imported(
    tmp_path: Path, name: str, safe: bool
) -> None:
    (tmp_path / "says.py").write_text(SAYS_SAFE)
    settings = ModelSettings(name="m", folder=tmp_path, implementation=f"says.{name}")
    assert registry.is_fork_safe(settings) is safe
    assert not [module for module in sys.modules if module.endswith("says")]


def test_an_installed_custom_runtime_is_read_from_its_file(fake_modules: Path) -> None:
    package = fake_modules / "fake_package"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('never run')\n")
    (package / "runtimes.py").write_text(SAYS_SAFE)
    safe = ModelSettings(name="m", implementation="fake_package.runtimes.Safe")
    assert registry.is_fork_safe(safe)
    unknown = ModelSettings(name="m", implementation="fake_package.nowhere.Safe")
    assert not registry.is_fork_safe(unknown)
    assert "fake_package" not in sys.modules
