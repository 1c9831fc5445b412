"""Offline validation of the monitoring files under deploy/ (tests/deploy/queries.py names
them): Prometheus's alert rules and scrape configuration, and the Grafana dashboard.

- Structure: JSON schemas of what Prometheus reads in a rule file (closed: Prometheus
  refuses a rule file with an unknown key) and of what Grafana needs from a dashboard that
  others import: every panel and query on the data source variable ``DS_PROMETHEUS``,
  panels on the 24-column grid without overlapping, every target a PromQL ``expr``.
- Semantics, with promtool (Debian's prometheus package; scripts/install_prometheus.sh)
  when it is installed: ``check rules`` and ``check config``, the alerts' unit tests
  (tests/deploy/alerts_test.yml, ``test rules``), and every dashboard query as a recording
  rule, so that Prometheus's own parser reads the dashboard's PromQL too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.deploy.crds import closed
from tests.deploy.queries import dashboard_queries

PROMTOOL = shutil.which("promtool")
ALERT_TESTS = Path(__file__).with_name("alerts_test.yml")
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SEVERITIES = ("critical", "warning", "info")


class MonitoringError(ValueError):
    """A rule file Prometheus would refuse, or a dashboard that would not show its data."""


_STRING = {"type": "string", "minLength": 1}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
# The keys of a rule file (Prometheus's rulefmt): a rule is an alert or a recording rule.
RULES_SCHEMA = closed(
    {
        "groups": {
            "type": "array",
            "minItems": 1,
            "items": closed(
                {
                    "name": _STRING,
                    "interval": _DURATION,
                    "limit": {"type": "integer"},
                    "rules": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "oneOf": [
                                closed(
                                    {
                                        "alert": _STRING,
                                        "expr": _STRING,
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _LABELS,
                                        "annotations": _LABELS,
                                    },
                                    "alert",
                                    "expr",
                                ),
                                closed(
                                    {"record": _STRING, "expr": _STRING, "labels": _LABELS},
                                    "record",
                                    "expr",
                                ),
                            ]
                        },
                    },
                },
                "name",
                "rules",
            ),
        }
    },
    "groups",
)

_INTEGER = {"type": "integer", "minimum": 0}
_GRID = closed(
    {"h": {"type": "integer", "minimum": 1}, "w": {"type": "integer", "minimum": 1, "maximum": 24},
     "x": {"type": "integer", "minimum": 0, "maximum": 23}, "y": _INTEGER},
    "h", "w", "x", "y",
)  # fmt: skip
_ON_DATASOURCE = {"const": DATASOURCE}
_TARGET = {
    "type": "object",
    "properties": {"refId": _STRING, "expr": _STRING, "datasource": _ON_DATASOURCE},
    "required": ["refId", "expr", "datasource"],
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {"id": _INTEGER, "type": _STRING, "title": _STRING, "gridPos": _GRID},
    "if": {"properties": {"type": {"const": "row"}}},
    "else": {
        "properties": {
            "datasource": _ON_DATASOURCE,
            "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        },
        "required": ["datasource", "targets", "description"],
    },
}
_VARIABLE = {
    "type": "object",
    "required": ["name", "type"],
    "properties": {"name": _STRING, "type": _STRING},
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {"properties": {"datasource": _ON_DATASOURCE}, "required": ["datasource", "query"]},
}
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": _STRING,
        "title": _STRING,
        # 36: data sources referenced by {type, uid}, as every panel here does.
        "schemaVersion": {"type": "integer", "minimum": 36},
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
        "templating": closed({"list": {"type": "array", "items": _VARIABLE}}, "list"),
    },
}


def _schema_check(document: Any, schema: dict[str, Any], what: str) -> None:
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(map(str, exc.absolute_path))
        raise MonitoringError(f"{what}: {where}: {exc.message}") from None


def validate_rules(document: Any) -> None:
    """Raise MonitoringError unless ``document`` is a rule file whose alerts each have a
    severity and the two annotations Alertmanager's notifications show."""
    _schema_check(document, RULES_SCHEMA, "rules")
    names = [rule["alert"] for group in document["groups"] for rule in group["rules"]]
    if len(names) != len(set(names)):
        raise MonitoringError(f"rules: an alert name is used twice: {sorted(names)}")
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("labels", {}).get("severity") not in SEVERITIES:
                raise MonitoringError(f"{rule['alert']}: severity not one of {SEVERITIES}")
            if not {"summary", "description"} <= set(rule.get("annotations", {})):
                raise MonitoringError(f"{rule['alert']}: needs a summary and a description")


def validate_dashboard(document: Any) -> None:
    """Raise MonitoringError unless ``document`` is a dashboard whose panels all query the
    data source variable, and that variable exists with the instance and model filters."""
    _schema_check(document, DASHBOARD_SCHEMA, "dashboard")
    variables = {variable["name"]: variable for variable in document["templating"]["list"]}
    source = variables.get("DS_PROMETHEUS", {})
    if (source.get("type"), source.get("query")) != ("datasource", "prometheus"):
        raise MonitoringError("dashboard: no data source variable DS_PROMETHEUS (prometheus)")
    for name in ("instance", "model"):
        if variables.get(name, {}).get("type") != "query":
            raise MonitoringError(f"dashboard: no query variable {name}")
    ids = [panel["id"] for panel in document["panels"]]
    if len(ids) != len(set(ids)):
        raise MonitoringError(f"dashboard: a panel id is used twice: {sorted(ids)}")
    taken: dict[tuple[int, int], str] = {}
    for panel in document["panels"]:
        grid = panel["gridPos"]
        if grid["x"] + grid["w"] > 24:
            raise MonitoringError(f"dashboard: {panel['title']!r} is wider than the grid")
        for row in range(grid["y"], grid["y"] + grid["h"]):
            for column in range(grid["x"], grid["x"] + grid["w"]):
                if (row, column) in taken:
                    other = taken[row, column]
                    raise MonitoringError(f"dashboard: {panel['title']!r} overlaps {other!r}")
                taken[row, column] = panel["title"]


def promtool(*args: str) -> str:
    """promtool's output; MonitoringError with it when promtool refuses."""
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise MonitoringError(f"promtool {' '.join(args)}:\n{run.stdout}{run.stderr}")
    return run.stdout


def check_rules_with_promtool(document: dict[str, Any], folder: Path) -> None:
    path = folder / "rules.yml"
    path.write_text(yaml.safe_dump(document))
    promtool("check", "rules", str(path))


def run_alert_unit_tests(document: dict[str, Any], folder: Path) -> None:
    """Run tests/deploy/alerts_test.yml against the rules ``document``, its annotations left
    out (promtool compares them with the expected ones, which the tests do not list)."""
    bare = {
        "groups": [
            {**group, "rules": [_without_annotations(rule) for rule in group["rules"]]}
            for group in document["groups"]
        ]
    }
    (folder / "rules.yml").write_text(yaml.safe_dump(bare))
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = ["rules.yml"]
    path = folder / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests))
    promtool("test", "rules", str(path))


def _without_annotations(rule: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in rule.items() if key != "annotations"}


def check_dashboard_queries_with_promtool(document: dict[str, Any], folder: Path) -> None:
    """Every query of the dashboard as a recording rule, for promtool to parse."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, expr in enumerate(dashboard_queries(document).values())
    ]
    check_rules_with_promtool({"groups": [{"name": "dashboard", "rules": rules}]}, folder)
