"""JSON schemas of the KubeRay resources deploy/ uses (``ray.io/v1`` RayCluster), written from
the fields KubeRay documents for its CRD (no package ships them). Pod templates inside are
checked separately against Kubernetes' own PodTemplateSpec schema."""

from __future__ import annotations

from typing import Any

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_POD_TEMPLATE = {"type": "object"}  # validated by kubernetes_validate as a PodTemplateSpec

_HEAD_GROUP = {
    "type": "object",
    "required": ["template"],
    "additionalProperties": False,
    "properties": {
        "rayStartParams": _STR_MAP,
        "template": _POD_TEMPLATE,
        "serviceType": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "headService": {"type": "object"},
        "enableIngress": {"type": "boolean"},
    },
}

_WORKER_GROUP = {
    "type": "object",
    "required": ["groupName", "template"],
    "additionalProperties": False,
    "properties": {
        "groupName": {"type": "string", "minLength": 1},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "numOfHosts": {"type": "integer", "minimum": 1},
        "rayStartParams": _STR_MAP,
        "template": _POD_TEMPLATE,
        "scaleStrategy": {"type": "object"},
        "suspend": {"type": "boolean"},
        "idleTimeoutSeconds": {"type": "integer"},
    },
}

RAY_CLUSTER: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "annotations": _STR_MAP,
                           "labels": _STR_MAP, "namespace": {"type": "string"}},
        },
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "additionalProperties": False,
            "properties": {
                "rayVersion": {"type": "string"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "autoscalerOptions": {"type": "object"},
                "headServiceAnnotations": _STR_MAP,
                "suspend": {"type": "boolean"},
                "headGroupSpec": _HEAD_GROUP,
                "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
            },
        },
    },
}


def pod_templates(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a RayCluster (head first, then each worker group)."""
    spec = resource["spec"]
    return [spec["headGroupSpec"]["template"]] + [
        g["template"] for g in spec.get("workerGroupSpecs", [])]
