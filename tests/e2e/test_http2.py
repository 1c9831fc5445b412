"""``--http2`` serves the same app with Hypercorn: HTTP/2 (prior knowledge) and HTTP/1.1."""

import httpx

from tests.support import Server


def test_http2_and_http11_both_infer(iris_repo):
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [6, 3, 5, 2]}]}
    with Server(iris_repo, "--workers", "0", "--http2") as server:
        server.wait_ready()
        with httpx.Client(http1=False, http2=True, base_url=server.url) as h2:
            response = h2.post("/v2/models/iris-logreg/infer", json=body)
            assert response.http_version == "HTTP/2"
            assert response.json()["outputs"][0]["data"] == [2]
            missing = h2.get("/v2/models/missing")
            assert missing.status_code == 404 and "missing" in missing.json()["error"]
        response = httpx.post(f"{server.url}/v2/models/iris-logreg/infer", json=body)
        assert response.http_version == "HTTP/1.1"
        assert response.json()["outputs"][0]["data"] == [2]
    assert server.returncode == 0
