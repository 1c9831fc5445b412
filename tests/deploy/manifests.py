"""Offline validation of the Kubernetes manifests under deploy/, one function per API family.

- Core kinds (Deployment, HorizontalPodAutoscaler, ...): ``kubernetes-validate``, strict, so
  an unknown field is an error as the API server's strict field validation makes it.
- KServe kinds: the ``kserve`` SDK's typed models. Its own models (V1beta1InferenceService,
  V1alpha1ClusterServingRuntime, ...) are walked through their ``attribute_map`` and
  ``openapi_types`` (an unknown key is an error) and built, which checks their required
  fields; the Kubernetes types inside them (V1Container, V1ObjectMeta, ...) are the
  ``kubernetes`` client's pydantic models, validated with unknown fields forbidden.
- Custom resources of Seldon Core v2 (Server, ServerConfig, Model) and KEDA (ScaledObject):
  the JSON schemas of tests/deploy/crds.py (their CRDs' field names); the pod specs and
  claim templates inside are validated as core kinds, so every container field is too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client.models as core_models
import kubernetes_validate
import pydantic
import yaml
from kserve import models as kserve_models

from tests.deploy.crds import CUSTOM_SPECS, closed

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# The newest Kubernetes the installed kubernetes-validate knows.
KUBERNETES_VERSION = kubernetes_validate.latest_version()


class ManifestError(ValueError):
    """A manifest the cluster would refuse (or silently half-apply)."""


def manifest_files() -> list[Path]:
    """The Kubernetes manifests: deploy/prometheus holds Prometheus's own files (rules, a
    scrape configuration), which tests/deploy/monitoring.py validates."""
    return sorted(
        p
        for p in DEPLOY.rglob("*")
        if p.suffix in (".yaml", ".yml") and DEPLOY / "prometheus" not in p.parents
    )


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(path.read_text()):
        if document is not None:
            yield document


def validate(document: dict[str, Any]) -> None:
    """Raise ManifestError when ``document`` is not a valid object of its kind."""
    api_version = document.get("apiVersion")
    if not isinstance(api_version, str) or not isinstance(document.get("kind"), str):
        raise ManifestError("apiVersion and kind must be strings")
    group = api_version.rpartition("/")[0]
    if group == "serving.kserve.io":
        validate_kserve(document)
    elif group in ("mlops.seldon.io", "keda.sh"):
        validate_custom(document)
    else:
        validate_core(document)


# -- core kinds ------------------------------------------------------------------------------
def validate_core(document: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise ManifestError(f"no schema for {document['apiVersion']} {document['kind']}") from exc
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(map(str, exc.absolute_path))
        raise ManifestError(f"{document['kind']}: {where}: {exc.message}") from exc


def validate_core_part(kind: str, spec: dict[str, Any], where: str) -> None:
    """``spec`` as the spec of a core object of ``kind`` (``Pod``, ``PersistentVolumeClaim``)."""
    try:
        validate_core({"apiVersion": "v1", "kind": kind, "metadata": {"name": "x"}, "spec": spec})
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from exc


# -- KServe kinds ----------------------------------------------------------------------------
KSERVE_KINDS = {
    "serving.kserve.io/v1alpha1": {
        "ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
        "ServingRuntime": "V1alpha1ServingRuntime",
        "TrainedModel": "V1alpha1TrainedModel",
    },
    "serving.kserve.io/v1beta1": {"InferenceService": "V1beta1InferenceService"},
}
_LIST = re.compile(r"(?:list|List)\[(.+)\]")
# A Kubernetes quantity (``256Mi``, ``1.5``, ``500m``), which the SDK types as a bare name.
_QUANTITY = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?")
_DICT = re.compile(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
}


def validate_kserve(document: dict[str, Any]) -> None:
    kinds = KSERVE_KINDS.get(document["apiVersion"], {})
    if document["kind"] not in kinds:
        raise ManifestError(f"unknown KServe kind {document['apiVersion']} {document['kind']}")
    _build(document, kinds[document["kind"]], document["kind"])


def _build(value: Any, kind: str, where: str) -> Any:
    """``value`` (JSON as in the manifest) as the SDK type named ``kind``."""
    if kind in _PRIMITIVES:
        # bool is an int in Python; a manifest's true is no number.
        if not isinstance(value, _PRIMITIVES[kind]) or (kind != "bool" and value is True):
            raise ManifestError(f"{where}: {value!r} is not a {kind}")
        return value
    if match := _LIST.fullmatch(kind):
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list")
        return [_build(item, match[1], f"{where}[{i}]") for i, item in enumerate(value)]
    if match := _DICT.fullmatch(kind):
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected a mapping")
        item_kind = match[1] or match[2]
        return {key: _build(item, item_kind, f"{where}.{key}") for key, item in value.items()}
    if kind == "ResourceQuantity":
        if isinstance(value, bool) or not _QUANTITY.fullmatch(str(value)):
            raise ManifestError(f"{where}: {value!r} is not a Kubernetes quantity")
        return value
    model = getattr(kserve_models, kind, None) or getattr(core_models, kind, None)
    if model is None:
        raise ManifestError(f"{where}: the SDK has no type {kind}")
    if isinstance(model, type) and issubclass(model, pydantic.BaseModel):
        try:  # the kubernetes client's models forbid unknown fields
            return model.model_validate(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(map(str, first["loc"]))
            raise ManifestError(f"{where}.{loc}: {first['msg']}") from None
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected a mapping ({kind})")
    attributes = {key: attribute for attribute, key in model.attribute_map.items()}
    unknown = sorted(set(value) - set(attributes))
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {unknown} for {kind}")
    arguments = {
        attributes[key]: _build(item, model.openapi_types[attributes[key]], f"{where}.{key}")
        for key, item in value.items()
    }
    try:  # the SDK's setters refuse a missing required field or a value out of its enum
        return model(**arguments)
    except ValueError as exc:
        raise ManifestError(f"{where}: {exc}") from None


def validate_custom(document: dict[str, Any]) -> None:
    kind = document["kind"]
    spec_schema = CUSTOM_SPECS.get((document["apiVersion"], kind))
    if spec_schema is None:
        raise ManifestError(f"unknown custom resource {document['apiVersion']} {kind}")
    schema = closed(
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
        },
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    )
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(map(str, exc.absolute_path))
        raise ManifestError(f"{kind}: {where}: {exc.message}") from None
    _build(document["metadata"], "V1ObjectMeta", f"{kind}.metadata")
    spec = document["spec"]
    if "podSpec" in spec:
        validate_core_part("Pod", spec["podSpec"], f"{kind}.spec.podSpec")
    for i, template in enumerate(spec.get("volumeClaimTemplates", [])):
        where = f"{kind}.spec.volumeClaimTemplates[{i}]"
        validate_core_part("PersistentVolumeClaim", template["spec"], where)
    for name, container in spec.get("imageOverrides", {}).items():
        _build(container, "V1Container", f"{kind}.spec.imageOverrides.{name}")
