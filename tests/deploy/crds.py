"""The custom resources that deploy/ uses, as JSON schemas of their spec: the property
names, types and required lists of their CRDs (v1alpha1), taken from Seldon Core v2's
operator/config/crd/bases/mlops.seldon.io_{serverconfigs,servers,models}.yaml and KEDA's
config/crd/bases/keda.sh_scaledobjects.yaml. A spec field they do not list is an error,
as the API server's strict field validation makes it; the core objects inside (pod specs,
claim templates) are left to tests/deploy/manifests.py, which validates them as core kinds.
"""

from __future__ import annotations

from typing import Any

_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_BOOLEAN = {"type": "boolean"}
_OBJECT = {"type": "object"}
_STRINGS = {"type": "array", "items": _STRING}
_INT_OR_STRING = {"anyOf": [_INTEGER, _STRING]}
# The properties of spec.podSpec in Seldon's CRDs (a subset of the core PodSpec's).
_SERVER_CONFIG_POD_FIELDS = [
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "containers",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "ephemeralContainers",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostUsers",
    "hostname",
    "imagePullSecrets",
    "initContainers",
    "nodeName",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "resourceClaims",
    "resources",
    "restartPolicy",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "securityContext",
    "serviceAccount",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "tolerations",
    "topologySpreadConstraints",
    "volumes",
]
# Server's podSpec (an override of the ServerConfig's) has all of those but these.
_NOT_IN_SERVER_POD = {
    "ephemeralContainers",
    "hostUsers",
    "os",
    "resourceClaims",
    "resources",
    "schedulingGates",
    "serviceAccount",
}
_SERVER_POD_FIELDS = [f for f in _SERVER_CONFIG_POD_FIELDS if f not in _NOT_IN_SERVER_POD]


def closed(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _pod(fields: list[str], *required: str) -> dict[str, Any]:
    return closed({key: {} for key in fields}, *required)


CUSTOM_SPECS: dict[tuple[str, str], dict[str, Any]] = {
    ("mlops.seldon.io/v1alpha1", "ServerConfig"): closed(
        {
            "podSpec": _pod(_SERVER_CONFIG_POD_FIELDS, "containers"),
            "volumeClaimTemplates": {
                "type": "array",
                "items": closed({"name": _STRING, "spec": _OBJECT}, "name", "spec"),
            },
        },
        "podSpec",
    ),
    ("mlops.seldon.io/v1alpha1", "Server"): closed(
        {
            "serverConfig": _STRING,
            "capabilities": _STRINGS,
            "extraCapabilities": _STRINGS,
            "deploymentStrategy": _OBJECT,
            "disableAutoUpdate": _BOOLEAN,
            "imageOverrides": closed({"agent": _OBJECT, "rclone": _OBJECT}),
            "podSpec": _pod(_SERVER_POD_FIELDS),
            "replicas": _INTEGER,
            "minReplicas": _INTEGER,
            "maxReplicas": _INTEGER,
            "statefulSetPersistentVolumeClaimRetentionPolicy": closed(
                {"whenDeleted": _STRING, "whenScaled": _STRING}
            ),
        },
        "serverConfig",
    ),
    ("mlops.seldon.io/v1alpha1", "Model"): closed(
        {
            "storageUri": _STRING,
            "artifactVersion": _INTEGER,
            "schemaUri": _STRING,
            "secretName": _STRING,
            "modelType": _STRING,
            "requirements": _STRINGS,
            "memory": _INT_OR_STRING,
            "server": _STRING,
            "preloaded": _BOOLEAN,
            "dedicated": _BOOLEAN,
            "replicas": _INTEGER,
            "minReplicas": _INTEGER,
            "maxReplicas": _INTEGER,
            "logger": closed({"percent": _INTEGER}),
            "explainer": closed({"type": _STRING, "modelRef": _STRING, "pipelineRef": _STRING}),
            "llm": closed({"modelRef": _STRING, "pipelineRef": _STRING}),
            "parameters": {
                "type": "array",
                "items": closed({"name": _STRING, "value": _STRING}, "name", "value"),
            },
            "dataflow": closed({"cleanTopicsOnDelete": _BOOLEAN}),
        },
        "storageUri",
    ),
    ("keda.sh/v1alpha1", "ScaledObject"): closed(
        {
            "scaleTargetRef": closed(
                {
                    "apiVersion": _STRING,
                    "kind": _STRING,
                    "name": _STRING,
                    "envSourceContainerName": _STRING,
                },
                "name",
            ),
            "pollingInterval": _INTEGER,
            "cooldownPeriod": _INTEGER,
            "initialCooldownPeriod": _INTEGER,
            "idleReplicaCount": _INTEGER,
            "minReplicaCount": _INTEGER,
            "maxReplicaCount": _INTEGER,
            "advanced": closed(
                {
                    "horizontalPodAutoscalerConfig": closed({"name": _STRING, "behavior": _OBJECT}),
                    "restoreToOriginalReplicaCount": _BOOLEAN,
                    "scalingModifiers": closed(
                        {
                            "formula": _STRING,
                            "target": _STRING,
                            "activationTarget": _STRING,
                            "metricType": _STRING,
                        }
                    ),
                }
            ),
            "fallback": closed(
                {"failureThreshold": _INTEGER, "replicas": _INTEGER, "behavior": _STRING},
                "failureThreshold",
                "replicas",
            ),
            "triggers": {
                "type": "array",
                "items": closed(
                    {
                        "type": _STRING,
                        "name": _STRING,
                        "metadata": {"type": "object", "additionalProperties": _STRING},
                        "metricType": _STRING,
                        "useCachedMetrics": _BOOLEAN,
                        "authenticationRef": closed({"name": _STRING, "kind": _STRING}, "name"),
                    },
                    "type",
                    "metadata",
                ),
            },
        },
        "scaleTargetRef",
        "triggers",
    ),
}
