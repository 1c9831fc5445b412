"""The autoscaling examples under deploy/kserve fit together (each file alone is validated by
test_manifests.py): the HPA and KEDA's ScaledObject scale the Deployment KServe creates for
an example InferenceService, on the gauge prometheus-adapter's rule serves, with one target.
That inferpool exports these metric names is checked against a running server in
tests/e2e/test_metrics_scaling.py."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.deploy.manifests import DEPLOY, documents

GAUGES = ("inferpool_model_in_flight_requests", "inferpool_model_queued_requests")


def load(name: str) -> dict[str, Any]:
    (document,) = documents(DEPLOY / "kserve" / name)
    return document


def standard_predictors() -> dict[str, str]:
    """Deployment name → InferenceService name, for the examples in KServe's Standard mode
    (a Deployment named ``<InferenceService>-predictor``)."""
    found = {}
    for path in sorted((DEPLOY / "kserve").glob("inferenceservice-*.yaml")):
        for document in documents(path):
            annotations = document["metadata"].get("annotations", {})
            if annotations.get("serving.kserve.io/deploymentMode") in ("Standard", "RawDeployment"):
                name = document["metadata"]["name"]
                found[f"{name}-predictor"] = name
    return found


def adapter_rule() -> dict[str, Any]:
    config = yaml.safe_load(load("prometheus-adapter-rules.yaml")["data"]["config.yaml"])
    (rule,) = config["rules"]
    return rule


def test_the_hpa_scales_a_predictor_on_a_metric_the_adapter_serves() -> None:
    hpa = load("hpa.yaml")["spec"]
    target = hpa["scaleTargetRef"]
    assert target["apiVersion"] == "apps/v1" and target["kind"] == "Deployment"
    assert target["name"] in standard_predictors()
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == GAUGES[0]
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert float(metric["pods"]["target"]["averageValue"]) > 0
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]

    rule = adapter_rule()
    # The adapter serves a series under its own name (no `name` section): both gauges.
    assert "name" not in rule
    pattern = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])
    assert pattern is not None
    assert all(re.fullmatch(pattern[1], gauge) for gauge in GAUGES)
    assert not re.fullmatch(pattern[1], "inferpool_model_requests_total")
    # Per pod: the labels Prometheus's pod scrape sets name the pod and its namespace.
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    query = rule["metricsQuery"]
    for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert placeholder in query


def test_keda_scales_the_same_deployment_on_the_same_gauge_and_target() -> None:
    hpa = load("hpa.yaml")["spec"]
    scaled = load("keda-scaledobject.yaml")["spec"]
    assert scaled["scaleTargetRef"] == hpa["scaleTargetRef"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (
        hpa["minReplicas"],
        hpa["maxReplicas"],
    )
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus"
    # Divided by the pods KEDA runs, as the HPA's per-pod AverageValue.
    assert trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert metadata["serverAddress"].startswith("http")
    assert metadata["threshold"] == hpa["metrics"][0]["pods"]["target"]["averageValue"]
    # The query sums the gauge over the pods of the model the Deployment serves.
    model = standard_predictors()[scaled["scaleTargetRef"]["name"]]
    query = metadata["query"]
    assert f"{GAUGES[0]}{{" in query
    assert f'model="{model}"' in query
    assert query.startswith("sum(")
