"""The objects of a tenant: its namespace, ResourceQuota, LimitRange and NetworkPolicy, the
cluster's PriorityClasses, the scratch claim where preemptible jobs keep their checkpoints
(docs/architecture/lending.md), and tenant_manifests, everything apply_tenant keeps in step."""

from __future__ import annotations

import copy
from typing import Any

from clusters.backends.base import BackendError, ClusterConfig, TenantLimits
from clusters.backends.kubernetes.common import (
    BORROW_CLASS,
    BORROW_VALUE,
    DNS_SUBDOMAIN,
    LABEL_TENANT,
    NEVER_PREEMPT,
    RESOURCE_NAME,
    SCRATCH_CLAIM,
    TIERS,
    check_namespace,
    checked_count,
    gpu_counts,
    managed_labels,
    priority_description,
)
from clusters.backends.kubernetes.kueue import (
    cluster_queue_manifest,
    local_queue_manifest,
    resource_flavor_manifest,
    workload_priority_class_manifests,
)

OBJECT_NAME = "gpu-portal"  # the ResourceQuota and LimitRange of a tenant namespace
NETWORK_POLICY = "gpu-portal-deny-other-namespaces"


def is_extended(name: str) -> bool:
    """Whether `name` is an extended resource (a device plugin's, HAMi's): a domain of its own,
    outside kubernetes.io, as Kubernetes tells them from its native resources."""
    domain, slash, _name = name.partition("/")
    native = domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    return (
        bool(slash)
        and not native
        and not name.startswith("requests.")
        and bool(RESOURCE_NAME.fullmatch(name))
    )


def keep_revoked(desired: dict, current: dict) -> dict:
    """`desired` (the tenant's ResourceQuota or LimitRange), with every extended resource that
    the cluster's copy (`current`) bounds and `desired` no longer names kept at 0: Kubernetes'
    quota leaves a resource it does not name unlimited, so a grant that ended (a MIG profile, a
    slice resource) must leave a 0 behind, not a gap."""
    kept = copy.deepcopy(desired)
    if desired.get("kind") == "ResourceQuota":
        hard = kept["spec"]["hard"]
        for key in (current.get("spec") or {}).get("hard") or {}:
            if key.startswith("requests.") and is_extended(key.removeprefix("requests.")) and key not in hard:
                hard[key] = "0"
    elif desired.get("kind") == "LimitRange":
        (item,) = kept["spec"]["limits"]
        for old in (current.get("spec") or {}).get("limits") or []:
            if old.get("type") != "Container":
                continue
            for resource in old.get("max") or {}:
                if is_extended(resource) and resource not in item["max"]:
                    for field in ("max", "default", "defaultRequest"):
                        item[field][resource] = "0"
    return kept


def namespace_manifest(limits: TenantLimits) -> dict:
    namespace = check_namespace(limits.account)
    labels = managed_labels(**{LABEL_TENANT: namespace, "pod-security.kubernetes.io/enforce": "restricted"})
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}


def resource_quota_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    hard = {f"requests.{resource}": str(gpus) for resource, gpus in gpu_counts(limits).items()}
    hard["count/jobs.batch"] = str(
        checked_count(config.k8s_max_jobs_per_tenant, "jobs per tenant", minimum=0)
    )
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": OBJECT_NAME,
            "namespace": check_namespace(limits.account),
            "labels": managed_labels(),
        },
        "spec": {"hard": hard},
    }


def limit_range_manifest(limits: TenantLimits) -> dict:
    """GPUs per container at most what the tenant holds; default 0, because a LimitRange's
    default limit is otherwise its max, which would give every container GPUs."""
    counts = gpu_counts(limits)
    item = {
        "type": "Container",
        "max": {resource: str(gpus) for resource, gpus in counts.items()},
        "default": dict.fromkeys(counts, "0"),
        "defaultRequest": dict.fromkeys(counts, "0"),
    }
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {
            "name": OBJECT_NAME,
            "namespace": check_namespace(limits.account),
            "labels": managed_labels(),
        },
        "spec": {"limits": [item]},
    }


def priority_class_manifests() -> list[dict]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": managed_labels()},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never" if name in NEVER_PREEMPT else "PreemptLowerPriority",
            "description": priority_description(name),
        }
        for name, value in [*TIERS.items(), (BORROW_CLASS, BORROW_VALUE)]
    ]


def network_policy_manifest(limits: TenantLimits) -> dict:
    """Ingress only from pods of the same namespace: other namespaces are denied."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY,
            "namespace": check_namespace(limits.account),
            "labels": managed_labels(),
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]},
    }


def scratch_claim_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    """The tenant's scratch, shared by its jobs' pods on any node (ReadWriteMany): where their
    checkpoints outlive the pods of an attempt. Created once and then left as it is (see
    KubernetesBackend._ensure): its class and access modes cannot change, its size only grow."""
    gib = checked_count(config.k8s_scratch_gib, "scratch size in GiB")
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": f"{gib}Gi"}},
    }
    if storage_class := config.k8s_scratch_storage_class:
        if not DNS_SUBDOMAIN.fullmatch(storage_class):
            raise BackendError(f"StorageClass {storage_class[:70]!r} is not a DNS subdomain")
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": SCRATCH_CLAIM,
            "namespace": check_namespace(limits.account),
            "labels": managed_labels(),
        },
        "spec": spec,
    }


def tenant_manifests(limits: TenantLimits, config: ClusterConfig) -> list[dict]:
    """Everything apply_tenant keeps in step, in the order it writes them: on Kueue clusters a
    tenant's ClusterQueue (in a cohort) before the LocalQueue that feeds it."""
    if limits.qos not in TIERS:
        raise BackendError(f"tier {limits.qos[:40]!r} is not one of {', '.join(TIERS)}")
    manifests = priority_class_manifests()
    if config.uses_kueue:
        manifests += workload_priority_class_manifests()
        if limits.cohort:
            manifests += [resource_flavor_manifest(), cluster_queue_manifest(limits)]
    manifests += [
        namespace_manifest(limits),
        resource_quota_manifest(limits, config),
        limit_range_manifest(limits),
        network_policy_manifest(limits),
    ]
    if checked_count(config.k8s_scratch_gib, "scratch size in GiB", minimum=0):
        manifests.append(scratch_claim_manifest(limits, config))
    if config.uses_kueue:
        manifests.append(local_queue_manifest(limits, config))
    return manifests
