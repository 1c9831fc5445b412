"""Every manifest under deploy/ is valid for its kind (tests/deploy/manifests.py says how each
family is checked), and a broken one is refused, so the validation can fail."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, ManifestError, documents, manifest_files, validate

FILES = manifest_files()


def test_the_manifests_are_there() -> None:
    names = {path.relative_to(DEPLOY).as_posix() for path in FILES}
    assert {
        "kserve/cluster-serving-runtime.yaml",
        "kserve/inferenceservice-sklearn.yaml",
        "kserve/inferenceservice-sklearn-v1.yaml",
        "kserve/inferenceservice-xgboost.yaml",
        "kserve/inferenceservice-lightgbm.yaml",
        "kserve/inferenceservice-mlflow.yaml",
        "kserve/multi-model.yaml",
        "seldon/serverconfig.yaml",
        "seldon/server.yaml",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_is_valid(path: Path) -> None:
    found = list(documents(path))
    assert found, f"{path} holds no document"
    for document in found:
        validate(document)


def _load(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(documents(DEPLOY / name)))


def _runtime_container(document: dict[str, Any]) -> dict[str, Any]:
    return document["spec"]["containers"][0]


def _server_config_container(document: dict[str, Any]) -> dict[str, Any]:
    return document["spec"]["podSpec"]["containers"][-1]


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "inferpool"},
    "spec": {
        "selector": {"matchLabels": {"app": "inferpool"}},
        "template": {
            "metadata": {"labels": {"app": "inferpool"}},
            "spec": {"containers": [{"name": "inferpool", "image": "inferpool:0.1.0"}]},
        },
    },
}

SCALED_OBJECT = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "inferpool"},
    "spec": {
        "scaleTargetRef": {"name": "inferpool"},
        "triggers": [{"type": "prometheus", "metadata": {"query": "up", "threshold": "4"}}],
    },
}

# (manifest or a document, how it is broken); each must be refused.
BROKEN: dict[str, tuple[str | dict[str, Any], Callable[[dict[str, Any]], None]]] = {
    "runtime: unknown container field": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: _runtime_container(d).update(imagee="inferpool:0.1.0"),
    ),
    "runtime: unknown spec field": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: d["spec"].update(protocolVersion=["v2"]),
    ),
    "runtime: no containers": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: d["spec"].pop("containers"),
    ),
    "runtime: autoSelect is not a boolean": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: d["spec"]["supportedModelFormats"][0].update(autoSelect="yes"),
    ),
    "runtime: a number as an environment value": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: _runtime_container(d)["env"].append({"name": "X", "value": 8080}),
    ),
    "runtime: probe port field misspelt": (
        "kserve/cluster-serving-runtime.yaml",
        lambda d: _runtime_container(d)["readinessProbe"]["httpGet"].update(prot=8080),
    ),
    "inferenceservice: no model format": (
        "kserve/inferenceservice-sklearn.yaml",
        lambda d: d["spec"]["predictor"]["model"].pop("modelFormat"),
    ),
    "inferenceservice: unknown predictor field": (
        "kserve/inferenceservice-sklearn.yaml",
        lambda d: d["spec"]["predictor"].update(terminationGracePeriod=45),
    ),
    "inferenceservice: unknown metadata field": (
        "kserve/inferenceservice-sklearn.yaml",
        lambda d: d["metadata"].update(label={"a": "b"}),
    ),
    "serverconfig: no podSpec": (
        "seldon/serverconfig.yaml",
        lambda d: d["spec"].pop("podSpec"),
    ),
    "serverconfig: unknown container field": (
        "seldon/serverconfig.yaml",
        lambda d: _server_config_container(d).update(environment=[]),
    ),
    "serverconfig: pod field Seldon's CRD does not have": (
        "seldon/serverconfig.yaml",
        lambda d: d["spec"]["podSpec"].update(hostnameOverride="x"),
    ),
    "serverconfig: claim template without spec": (
        "seldon/serverconfig.yaml",
        lambda d: d["spec"]["volumeClaimTemplates"][0].pop("spec"),
    ),
    "server: no serverConfig": (
        "seldon/server.yaml",
        lambda d: d["spec"].pop("serverConfig"),
    ),
    "server: unknown spec field": (
        "seldon/server.yaml",
        lambda d: d["spec"].update(serverconfig="inferpool"),
    ),
    "model: requirements not a list": (
        "seldon/model-iris.yaml",
        lambda d: d["spec"].update(requirements="sklearn"),
    ),
    "model: no storageUri": (
        "seldon/model-iris.yaml",
        lambda d: d["spec"].pop("storageUri"),
    ),
    "scaledobject: trigger without metadata": (
        SCALED_OBJECT,
        lambda d: d["spec"]["triggers"][0].pop("metadata"),
    ),
    "scaledobject: unknown spec field": (
        SCALED_OBJECT,
        lambda d: d["spec"].update(maxReplicas=10),
    ),
    "deployment: unknown field": (
        DEPLOYMENT,
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagee="x"),
    ),
    "deployment: replicas not a number": (
        DEPLOYMENT,
        lambda d: d["spec"].update(replicas="two"),
    ),
    "unknown kind": (
        DEPLOYMENT,
        lambda d: d.update(apiVersion="example.com/v1", kind="Widget"),
    ),
}


@pytest.mark.parametrize("document", [DEPLOYMENT, SCALED_OBJECT], ids=["deployment", "keda"])
def test_the_documents_broken_below_are_valid(document: dict[str, Any]) -> None:
    validate(copy.deepcopy(document))  # so that the broken ones fail for their breakage


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_manifest_is_refused(case: str) -> None:
    source, breakage = BROKEN[case]
    document = _load(source) if isinstance(source, str) else copy.deepcopy(source)
    breakage(document)
    with pytest.raises(ManifestError):
        validate(document)
