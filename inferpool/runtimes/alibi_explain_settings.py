"""The settings of an alibi explainer model (``alibi_explain.py``), read and checked
without importing alibi: MLServer's ``parameters.extra`` of
``mlserver_alibi_explain.AlibiExplainRuntime``, and which model an ``infer_uri`` names.

- ``explainer_type``: the explainer, by MLServer's names (``EXPLAINERS``);
- ``infer_uri``: for a black-box explainer, the explained model: MLServer's
  ``http://host:port/v2/models/<name>[/versions/<v>]/infer`` (host and port are ignored:
  the model is this server's, called through the engine) or the model's name alone; for a
  white-box one, the model file it holds (joblib or pickle; for IntegratedGradients a
  Keras model: an HDF5 or .keras file, or a SavedModel folder), relative to the model's
  folder;
- ``infer_output``: the explained model's output to explain (default: its first);
- ``explainer_batch``: a black-box explainer explains every row of a request at once
  (default: the first row only, as anchors explain one instance); white-box explainers
  explain every row whatever it says, as MLServer's do;
- ``init_parameters``: build the explainer from these keyword arguments instead of
  loading the one saved (``explainer.save``) in the model's ``uri``;
- ``explain_parameters`` (inferpool's): default keyword arguments of ``explain``, which
  a request's ``parameters.explain_parameters`` add to and override.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from inferpool.errors import BadRequest, ModelLoadError

BLACK_BOX = "black-box"  # calls the explained model, a model of this server
WHITE_BOX = "white-box"  # holds the explained model itself

# MLServer 1.7.1's explainer types: the alibi class and how the explainer reaches its model.
EXPLAINERS: dict[str, tuple[str, str]] = {
    "anchor_tabular": ("AnchorTabular", BLACK_BOX),
    "anchor_text": ("AnchorText", BLACK_BOX),
    "anchor_image": ("AnchorImage", BLACK_BOX),
    "kernel_shap": ("KernelShap", BLACK_BOX),
    "tree_shap": ("TreeShap", WHITE_BOX),
    "tree_partial_dependence": ("TreePartialDependence", WHITE_BOX),
    "tree_partial_dependence_variance": ("PartialDependenceVariance", WHITE_BOX),
    # A TensorFlow (Keras) model's: its environment needs TensorFlow beside alibi.
    "integrated_gradients": ("IntegratedGradients", WHITE_BOX),
}
KNOWN = ("explainer_type", "infer_uri", "infer_output", "explainer_batch", "init_parameters",
         "explain_parameters", "ssl_verify_path")  # fmt: skip

# The V2 infer path MLServer's infer_uri ends with.
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer/?")
_NAME = re.compile(r"[A-Za-z0-9_.~-]+")


@dataclass(frozen=True)
class ExplainSettings:
    """An explainer model's settings, checked."""

    explainer_type: str
    infer_uri: str
    infer_output: str | None = None
    explainer_batch: bool = False
    init_parameters: dict[str, Any] | None = None
    explain_parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def alibi_class(self) -> str:
        return EXPLAINERS[self.explainer_type][0]

    @property
    def black_box(self) -> bool:
        return EXPLAINERS[self.explainer_type][1] == BLACK_BOX


def read_settings(extra: Mapping[str, Any]) -> ExplainSettings:
    """``parameters.extra`` of an explainer model, checked; else a one-sentence
    ModelLoadError naming the setting."""
    explainer_type = extra.get("explainer_type")
    if explainer_type not in EXPLAINERS:
        raise ModelLoadError(
            f"parameters.extra.explainer_type must be one of {', '.join(EXPLAINERS)}, "
            f"not {explainer_type!r}"
        )
    unknown = sorted(set(extra) - set(KNOWN))
    if unknown:
        raise ModelLoadError(
            f"parameters.extra of an alibi explainer has no setting {', '.join(unknown)} "
            f"(it takes {', '.join(KNOWN)})"
        )
    infer_uri = extra.get("infer_uri")
    if not isinstance(infer_uri, str) or not infer_uri.strip():
        what = "model" if EXPLAINERS[explainer_type][1] == BLACK_BOX else "model file"
        raise ModelLoadError(
            f"parameters.extra.infer_uri must name the explained {what}, not {infer_uri!r}"
        )
    output = extra.get("infer_output")
    if output is not None and not isinstance(output, str):
        raise ModelLoadError(f"parameters.extra.infer_output must be a string, not {output!r}")
    batch = extra.get("explainer_batch", False)
    if batch is None:
        batch = False  # MLServer's default, written out
    if not isinstance(batch, bool):
        raise ModelLoadError(
            f"parameters.extra.explainer_batch must be true or false, not {batch!r}"
        )
    return ExplainSettings(
        explainer_type,
        infer_uri.strip(),
        output,
        batch,
        _mapping(extra.get("init_parameters"), "init_parameters", none=True),
        _mapping(extra.get("explain_parameters"), "explain_parameters") or {},
    )


def model_of(infer_uri: str) -> tuple[str, str | None]:
    """The model (and version) an ``infer_uri`` names: MLServer's V2 infer URL, any host,
    or a model's name alone. A URL of another path (a pipeline's, V1's) is a ModelLoadError."""
    if _NAME.fullmatch(infer_uri):
        return infer_uri, None
    parts = urlsplit(infer_uri)
    path = parts.path if parts.scheme or parts.netloc else infer_uri.split("?")[0]
    found = _INFER_PATH.search(path)
    if found is None or not path.endswith(found.group(0)):
        raise ModelLoadError(
            f"parameters.extra.infer_uri {infer_uri!r} names no model of this server: write "
            "http://<host>/v2/models/<name>/infer (or the model's name)"
        )
    return found.group("name"), found.group("version")


def explain_parameters(defaults: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of one ``explain``: the settings', then the request's
    ``parameters.explain_parameters`` (MLServer's place for them) over them."""
    asked = request.get("explain_parameters")
    if asked is None:
        return dict(defaults)
    if not isinstance(asked, Mapping):
        raise BadRequest(f"parameters.explain_parameters must be an object, not {asked!r}")
    return {**defaults, **asked}


def _mapping(value: Any, name: str, none: bool = False) -> dict[str, Any] | None:
    if value is None:
        return None if none else {}
    if not isinstance(value, dict):
        raise ModelLoadError(f"parameters.extra.{name} must be an object, not {value!r}")
    return value
