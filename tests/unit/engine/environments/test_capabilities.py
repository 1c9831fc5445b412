"""Capabilities, requirements and the capability filter (engine/environments/capabilities.py,
engine/pool/groups.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sklearn

from inferpool.engine.environments.capabilities import (
    Capabilities,
    check_requirements,
    importable_here,
    read_here,
    unmet,
)
from inferpool.engine.pool.groups import (
    RuntimeLibrary,
    WorkerGroup,
    eligible,
    refusal,
    runtime_library,
)
from inferpool.engine.pool.outages import Outages
from inferpool.settings import ModelSettings

OFFER = Capabilities(
    "3.11.7",
    {"scikit-learn": "1.5.2", "sklearn": "1.5.2", "xgboost-cpu": "3.2.0", "xgboost": "3.2.0"},
    frozenset({"big"}),
)


@pytest.mark.parametrize(
    ("requirements", "missing"),
    [
        ([], None),
        (["big"], None),
        (["gpu"], "gpu"),
        (["scikit-learn==1.5.2", "sklearn<1.6", "Scikit_Learn>=1"], None),
        (["scikit-learn>=1.6"], "scikit-learn>=1.6"),
        (["xgboost>=3"], None),  # met by xgboost-cpu, which provides the module
        (["lightgbm"], "lightgbm"),
        (["big", "lightgbm>=4.0", "gpu"], "lightgbm>=4.0"),  # the first unmet, as written
    ],
)
def test_unmet_names_the_first_requirement_not_met(requirements, missing) -> None:
    assert unmet(requirements, OFFER) == missing


def test_a_prerelease_or_an_odd_version_is_compared_as_pep_440_says() -> None:
    offer = Capabilities("3.11.7", {"lib": "2.0rc1", "odd": "not-a-version"})
    assert unmet(["lib>=2.0rc1"], offer) is None
    assert unmet(["lib>=2.0"], offer) == "lib>=2.0"
    assert unmet(["odd>=1"], offer) == "odd>=1"
    assert unmet(["odd"], offer) is None  # present, no version asked


def test_a_requirement_that_is_not_a_tag_or_a_specifier_fails_the_settings() -> None:
    check_requirements(["big", "lightgbm>=4.0"])
    with pytest.raises(ValueError, match="'lightgbm>>4' is not a tag or a package spec"):
        check_requirements(["lightgbm>>4"])
    with pytest.raises(ValueError, match="requirements"):
        ModelSettings(name="m", requirements=["a b c"])


def test_this_interpreter_offers_its_packages_under_names_and_modules() -> None:
    here = read_here()
    assert here.python == ".".join(map(str, sys.version_info[:3]))
    assert here.version_of("scikit-learn") == here.version_of("sklearn") == sklearn.__version__
    assert here.with_tags(["a"]).tags == {"a"} and here.tags == frozenset()
    assert Capabilities.from_dict(json.loads(json.dumps(here.to_dict()))) == here
    assert f"sklearn {sklearn.__version__}" in here.describe()


def test_the_probe_module_prints_what_read_here_reads() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inferpool.engine.environments.capabilities"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert Capabilities.from_dict(json.loads(done.stdout)) == read_here()


class _Group:
    def __init__(self, environment: str | None, capabilities: Capabilities) -> None:
        self.environment = None if environment is None else type("E", (), {"key": environment})
        self.capabilities = capabilities
        self.outages = Outages(1)

    def offers(self, module: str) -> bool:
        return self.capabilities.version_of(module) is not None


class _Worker:
    def __init__(self, slot: int) -> None:
        self.slot = slot


def test_workers_are_filtered_by_environment_then_requirements() -> None:
    plain = _Group(None, OFFER.with_tags([]))
    tagged = _Group(None, OFFER)
    isolated = _Group("abc", OFFER)
    groups = {0: plain, 1: plain, 2: tagged, 3: isolated}
    workers = [_Worker(slot) for slot in groups]
    settings = ModelSettings(name="m", runtime="sklearn", requirements=["big"])
    chosen, refused = eligible(settings, None, workers, groups.__getitem__)
    assert [w.slot for w in chosen] == [2]
    assert refused == {"lack 'big'": 2, "run an environment": 1}
    chosen, refused = eligible(settings, "abc", workers, groups.__getitem__)
    assert [w.slot for w in chosen] == [3]
    assert refused == {"run another environment": 3}
    assert refusal(isolated, "abc", ["lightgbm"]) == "lack 'lightgbm'"  # type: ignore[arg-type]


def test_a_built_in_runtimes_library_is_an_implicit_requirement() -> None:
    """DESIGN §3: a worker offers the runtimes importable in its environment."""
    assert runtime_library(ModelSettings(name="m", runtime="lightgbm")) == RuntimeLibrary(
        "lightgbm", "lightgbm"
    )
    assert runtime_library(ModelSettings(name="m", runtime="xgboost")).module == "xgboost"
    assert runtime_library(ModelSettings(name="m", implementation="my.Runtime")) is None
    lightgbm = RuntimeLibrary("lightgbm", "lightgbm")
    # The server's own group: what this interpreter can import (lightgbm is installed here).
    own = WorkerGroup("default", range(2), None, Outages(2))  # type: ignore[arg-type]
    assert refusal(own, None, [], lightgbm) is None
    assert refusal(own, None, [], RuntimeLibrary("no_such_library_here", "x")) == (
        "lack 'no_such_library_here' (install inferpool[x])"
    )
    # An environment's group: what its probe found there.
    isolated = WorkerGroup(
        "env-abc", range(2, 3), None, Outages(1),  # type: ignore[arg-type]
        environment=type("E", (), {"key": "abc"}), probed=OFFER,  # type: ignore[arg-type]
    )  # fmt: skip
    assert refusal(isolated, "abc", [], lightgbm) == "lack 'lightgbm' (install inferpool[lightgbm])"
    assert refusal(isolated, "abc", [], RuntimeLibrary("xgboost", "xgboost")) is None


def test_importable_here_finds_without_importing_and_survives_a_refusing_finder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refuse:
        def find_spec(self, name, path, target=None):
            if name == "refused_module":
                raise ModuleNotFoundError(name, name=name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    importable_here.cache_clear()
    assert importable_here("json") and not importable_here("no_such_module_anywhere")
    assert not importable_here("refused_module")
    importable_here.cache_clear()


def test_a_library_no_extra_installs_says_what_to_do_instead() -> None:
    """alibi-detect and alibi need numpy<2: no extra installs them beside the server, an
    environment holds them (docs/runtimes/alibi-detect.md, alibi-explain.md)."""
    library = runtime_library(
        ModelSettings(name="m", implementation="mlserver_alibi_detect.AlibiDetectRuntime")
    )
    own = WorkerGroup("default", range(2), None, Outages(2))  # type: ignore[arg-type]
    assert refusal(own, None, [], library) == (
        "lack 'alibi_detect' (run the model in an environment holding alibi-detect: "
        "docs/runtimes/alibi-detect.md)"
    )
    explainer = runtime_library(
        ModelSettings(name="e", implementation="mlserver_alibi_explain.AlibiExplainRuntime")
    )
    assert refusal(own, None, [], explainer) == (
        "lack 'alibi' (run the model in an environment holding alibi: "
        "docs/runtimes/alibi-explain.md)"
    )
