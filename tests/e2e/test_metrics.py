"""Prometheus metrics on the metrics port reflect the requests served and readiness."""

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(server) -> dict:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
    return samples


def test_metrics_count_requests_per_model(iris_server):
    model = (("model", "iris-rf"), ("version", ""))
    before = scrape(iris_server)
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    for _ in range(3):
        httpx.post(f"{iris_server.url}/v2/models/iris-rf/infer", json=body)
    httpx.post(f"{iris_server.url}/v2/models/iris-rf/infer", json={"inputs": []})
    after = scrape(iris_server)
    requests = "inferpool_model_requests_total"
    ok = tuple(sorted((*model, ("code", "200"), ("protocol", "rest"))))
    bad = tuple(sorted((*model, ("code", "400"), ("protocol", "rest"))))
    assert after[(requests, ok)] - before.get((requests, ok), 0) == 3
    assert after[(requests, bad)] - before.get((requests, bad), 0) == 1
    duration = tuple(sorted((*model, ("protocol", "rest"))))
    assert after[("inferpool_model_request_duration_seconds_sum", duration)] > 0
    assert after[("inferpool_model_ready", model)] == 1
    assert after[("inferpool_server_ready", ())] == 1
    stage = (*model, ("stage", "predict"))
    assert after[("inferpool_model_stage_duration_seconds_sum", tuple(sorted(stage)))] > 0
