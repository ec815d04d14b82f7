"""What the Kubernetes backend's pure tests share: a cluster config, a job spec, and the check of
Kueue's objects against their CRDs."""

import jsonschema

from clusters.backends.base import ClusterConfig, JobSpec
from tests.k8s_apiserver.store import parse_quantity  # Kubernetes' rules for quantities

TOKEN = "0123456789abcdef0123456789abcdef"


def make_config(**overrides) -> ClusterConfig:
    values = {
        "slug": "k8s-test",
        "kind": "kubernetes",
        "k8s_api_url": "https://k8s.example.org:6443",
        "k8s_token": "secret-token-value",
    }
    return ClusterConfig(**(values | overrides))


def make_spec(**overrides) -> JobSpec:
    values = {
        "token": TOKEN,
        "name": "train resnet",
        "account": "protein-lab",
        "qos": "portal-high",
        "priority": "normal",
        "partition": "NVIDIA-H100-80GB-HBM3",
        "gpu_type": "h100",
        "k8s_resource": "nvidia.com/gpu",
        "k8s_product": "NVIDIA-H100-80GB-HBM3",
        "gpus_per_node": 4,
        "nodes": 1,
        "walltime_minutes": 90,
        "script": "#!/bin/bash\nset -euo pipefail\npython train.py\n",
        "env": {"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN"},
        "cpus_per_gpu": 6,
        "mem_per_gpu_mb": 32_000,
        "labels": {"tenant": "protein-lab", "job": "42", "scenario": "ai-training"},
    }
    return JobSpec(**(values | overrides))


# ------------------------------------------------------------------ Kueue CRDs --
# kubernetes-validate knows no CRD: Kueue's objects (v1beta1) are checked against this schema,
# written from Kueue's API types (apis/kueue/v1beta1, their kubebuilder markers), as strict as
# the built-in validation (no unknown field), and against the rules its CRDs' CEL expressions and
# its webhooks hold (kueue_errors).
KUEUE_API = "kueue.x-k8s.io/v1beta1"
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_NAME = {"type": "string", "maxLength": 253, "pattern": _SUBDOMAIN}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY_VALUE = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": _QUANTITY}]}


def _object(properties: dict, *required: str) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _array(items: dict, min_items: int = 0, max_items: int | None = None) -> dict:
    bounds = {"minItems": min_items} | ({"maxItems": max_items} if max_items is not None else {})
    return {"type": "array", "items": items} | bounds


def _enum(*values: str) -> dict:
    return {"type": "string", "enum": list(values)}


_SELECTOR = _object(
    {
        "matchLabels": _STRINGS,
        "matchExpressions": _array(
            _object(
                {
                    "key": {"type": "string"},
                    "operator": _enum("In", "NotIn", "Exists", "DoesNotExist"),
                    "values": _array({"type": "string"}),
                },
                "key",
                "operator",
            )
        ),
    }
)
_QUOTA = _object(
    {
        "name": {"type": "string", "minLength": 1},
        "nominalQuota": _QUANTITY_VALUE,
        "borrowingLimit": _QUANTITY_VALUE,
        "lendingLimit": _QUANTITY_VALUE,
    },
    "name",
    "nominalQuota",
)
_RESOURCE_GROUP = _object(
    {
        "coveredResources": _array({"type": "string", "minLength": 1}, 1, 64),
        "flavors": _array(
            _object({"name": _NAME, "resources": _array(_QUOTA, 1, 64)}, "name", "resources"), 1, 64
        ),
    },
    "coveredResources",
    "flavors",
)
_SPECS = {
    "ClusterQueue": _object(
        {
            "resourceGroups": _array(_RESOURCE_GROUP, 0, 16),
            "cohort": _NAME,
            "queueingStrategy": _enum("StrictFIFO", "BestEffortFIFO"),
            "namespaceSelector": _SELECTOR,
            "preemption": _object(
                {
                    "reclaimWithinCohort": _enum("Never", "LowerPriority", "Any"),
                    "borrowWithinCohort": _object(
                        {
                            "policy": _enum("Never", "LowerPriority"),
                            "maxPriorityThreshold": {"type": "integer"},
                        }
                    ),
                    "withinClusterQueue": _enum("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
                }
            ),
            "stopPolicy": _enum("None", "Hold", "HoldAndDrain"),
        }
    ),
    "LocalQueue": _object({"clusterQueue": _NAME, "stopPolicy": _enum("None", "Hold", "HoldAndDrain")}),
    "ResourceFlavor": _object(
        {
            "nodeLabels": _STRINGS | {"maxProperties": 8},
            "nodeTaints": _array({"type": "object"}, 0, 8),
            "tolerations": _array({"type": "object"}, 0, 8),
            "topologyName": _NAME,
        }
    ),
}
_NAMESPACED = {"LocalQueue"}


def kueue_schema(kind: str) -> dict:
    """The JSON schema of one Kueue kind, as written (what a server adds to metadata allowed)."""
    metadata = _object(
        {
            "name": _NAME,
            "labels": _STRINGS,
            "annotations": _STRINGS,
            **{key: {"type": "string"} for key in ("uid", "resourceVersion", "creationTimestamp")},
            "generation": {"type": "integer"},
        }
        | ({"namespace": {"type": "string", "pattern": _LABEL}} if kind in _NAMESPACED else {}),
        "name",
        *(("namespace",) if kind in _NAMESPACED else ()),
    )
    top = {"apiVersion": {"const": KUEUE_API}, "kind": {"const": kind}, "metadata": metadata}
    if kind == "WorkloadPriorityClass":
        int32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
        return _object(
            top | {"value": int32, "description": {"type": "string"}}, "apiVersion", "kind", "value"
        )
    return _object(
        top | {"spec": _SPECS[kind], "status": {"type": "object"}}, "apiVersion", "kind", "metadata"
    )


def kueue_errors(manifest: dict) -> list[str]:
    """What Kueue's API server would refuse in one of its objects: the schema's errors, then the
    CEL rules and webhook checks of a ClusterQueue (a flavor lists its group's covered resources,
    in their order; limits only in a cohort; lendingLimit at most nominalQuota; no borrowing
    preemption without reclaiming; a resource and a flavor in one group only)."""
    kind = manifest.get("kind", "")
    if kind not in {*_SPECS, "WorkloadPriorityClass"}:
        return [f"not a Kueue kind: {kind!r}"]
    validator = jsonschema.Draft7Validator(kueue_schema(kind))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    if errors or kind != "ClusterQueue":
        return errors
    spec = manifest.get("spec") or {}
    groups = spec.get("resourceGroups") or []
    for index, group in enumerate(groups):
        for flavor in group["flavors"]:
            names = [quota["name"] for quota in flavor["resources"]]
            if names != group["coveredResources"]:
                errors.append(f"resourceGroups[{index}]: flavor {flavor['name']} lists {names}")
            for quota in flavor["resources"]:
                for key in ("borrowingLimit", "lendingLimit"):
                    if key in quota and not spec.get("cohort"):
                        errors.append(f"{quota['name']}: {key} must be nil when cohort is empty")
                lending = quota.get("lendingLimit")
                if lending is not None and parse_quantity(lending) > parse_quantity(quota["nominalQuota"]):
                    errors.append(
                        f"{quota['name']}: lendingLimit must be less than or equal to the nominalQuota"
                    )
    for what, values in (
        ("resource", [name for group in groups for name in group["coveredResources"]]),
        ("flavor", [flavor["name"] for group in groups for flavor in group["flavors"]]),
    ):
        if len(values) != len(set(values)):
            errors.append(f"a {what} is in more than one resource group")
    preemption = spec.get("preemption") or {}
    borrowing = (preemption.get("borrowWithinCohort") or {}).get("policy", "Never")
    if preemption.get("reclaimWithinCohort", "Never") == "Never" and borrowing != "Never":
        errors.append("reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
    return errors
