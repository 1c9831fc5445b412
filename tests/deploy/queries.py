"""The monitoring files under deploy/ and the PromQL queries in them: the alert rules
(deploy/prometheus/alerts.yml) and the Grafana dashboard (deploy/grafana/inferpool.json),
each query as Prometheus would receive it. Read by tests/deploy/monitoring.py (structure,
promtool) and by the live tests tests/e2e/test_dashboard_metrics.py (every metric a query
names exists) and tests/e2e/test_prometheus.py (the rules in a real Prometheus); imports
nothing beyond PyYAML, which every one of their environments has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
SCRAPE_CONFIG = PROMETHEUS / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "inferpool.json"

# Grafana's interval variables, which only Grafana fills in: any duration parses the same.
_GRAFANA_INTERVALS = re.compile(r"\$(?:__rate_interval|__interval|__range)\b|\$\{__\w+\}")
# A query variable's `label_values(SELECTOR, label)`: Grafana asks the series API for
# SELECTOR; label_values(label) alone names no metric.
_LABEL_VALUES = re.compile(r"label_values\((.+),\s*\w+\)", re.DOTALL)


def load_alerts(path: Path = ALERTS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def as_promql(expr: str) -> str:
    """A dashboard expression as Prometheus receives it: the `$model`/`$instance` inside
    label matchers stay (Grafana puts a regex there), interval variables become 5m."""
    return _GRAFANA_INTERVALS.sub("5m", expr)


def alert_queries(document: dict[str, Any]) -> dict[str, str]:
    """``group/alert`` → expr of every rule in a rule file."""
    return {
        f"{group['name']}/{rule.get('alert') or rule.get('record')}": rule["expr"]
        for group in document["groups"]
        for rule in group["rules"]
    }


def dashboard_queries(document: dict[str, Any]) -> dict[str, str]:
    """``where`` → PromQL of every panel target and every query variable's selector."""
    found = {}
    for panel in _panels(document["panels"]):
        for target in panel.get("targets", []):
            found[f"panel {panel['id']} ({panel['title']}) {target['refId']}"] = as_promql(
                target["expr"]
            )
    for variable in document["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        if match := _LABEL_VALUES.fullmatch(text.strip()):
            found[f"variable {variable['name']}"] = as_promql(match[1])
    return found


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    flat = []
    for panel in panels:
        flat.append(panel)
        flat.extend(_panels(panel.get("panels", [])))
    return flat
