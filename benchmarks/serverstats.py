"""Per-stage split from the server's own statistics (Triton's statistics extension).

``GET /v2/models/{name}/stats`` is read before and after a measurement; the difference
gives the mean time per request in each stage. Servers without it yield None ("n/a").
"""

from __future__ import annotations

import httpx

# Our column name -> Triton's inference_stats field.
STAGES = {
    "queue": "queue",
    "decode": "compute_input",
    "predict": "compute_infer",
    "encode": "compute_output",
}


def fetch(base_url: str, model: str) -> dict | None:
    """The model's inference_stats, or None when the server does not serve statistics."""
    try:
        response = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=5.0)
        if response.status_code != 200:
            return None
        return response.json()["model_stats"][0]["inference_stats"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def stage_split(before: dict | None, after: dict | None) -> dict[str, float] | None:
    """Mean microseconds per request in each stage between two snapshots."""
    if before is None or after is None:
        return None
    split = {}
    for column, field in STAGES.items():
        try:
            count = after[field]["count"] - before[field]["count"]
            nanos = after[field]["ns"] - before[field]["ns"]
        except (KeyError, TypeError):
            return None
        split[column] = nanos / count / 1000 if count > 0 else float("nan")
    return split
