"""Kueue's objects: a tenant namespace's LocalQueue, and on clusters with cohorts a tenant's own
ClusterQueue with the cohort's lending limits (docs/architecture/lending.md), the portal's one
ResourceFlavor, and WorkloadPriorityClasses named as the PriorityClasses."""

from __future__ import annotations

from clusters.backends.base import BackendError, ClusterConfig, TenantLimits
from clusters.backends.kubernetes.common import (
    BORROW_CLASS,
    BORROW_VALUE,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    LABEL_TENANT,
    TIERS,
    check_namespace,
    check_resource,
    checked_count,
    gpu_counts,
    managed_labels,
    priority_description,
)
from clusters.shares import SLICE_RESOURCES

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
LOCAL_QUEUE = "portal"  # the LocalQueue of every tenant namespace
# Kueue: a tenant in a cohort gets its own ClusterQueue, with the portal's one ResourceFlavor.
KUEUE_FLAVOR = "gpu-portal"
CLUSTER_QUEUE_PREFIX = "portal-"
# What a tenant's ClusterQueue covers besides its devices: Kueue admits no workload that asks for
# a resource its ClusterQueue does not cover, and the portal bounds neither CPUs nor memory (the
# namespace's ResourceQuota leaves them unlimited) nor a slice's caps (HAMi's memory and compute,
# bounded per device). Their quota is one no job reaches, small enough that a cohort's sum stays
# far inside Kueue's 64-bit arithmetic; none of it is lent or borrowed.
UNBOUNDED_QUOTA = {"cpu": "1M", "memory": "1Pi"}
SLICE_CAP_QUOTA = "1G"
KUEUE_MAX_RESOURCES = 64  # per resource group


def check_cohort(cohort: str) -> str:
    if not isinstance(cohort, str) or not DNS_SUBDOMAIN.fullmatch(cohort):
        raise BackendError(f"Kueue cohort {str(cohort)[:70]!r} is not a DNS subdomain")
    return cohort


def cluster_queue_name(account: str) -> str:
    """The ClusterQueue of a tenant in a cohort (a DNS subdomain: the prefix and a DNS label)."""
    return CLUSTER_QUEUE_PREFIX + check_namespace(account)


def local_queue_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    """The namespace's LocalQueue: into the tenant's own ClusterQueue when it is in a cohort,
    into the cluster's shared one otherwise."""
    if limits.cohort:
        cluster_queue = cluster_queue_name(limits.account)
    else:
        cluster_queue = config.k8s_kueue_cluster_queue
        if not DNS_LABEL.fullmatch(cluster_queue or ""):
            raise BackendError(f"Kueue ClusterQueue name {cluster_queue[:70]!r} is not a DNS label")
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {
            "name": LOCAL_QUEUE,
            "namespace": check_namespace(limits.account),
            "labels": managed_labels(),
        },
        "spec": {"clusterQueue": cluster_queue},
    }


def resource_flavor_manifest() -> dict:
    """The one flavor of the tenants' ClusterQueues: no node labels, so it fits every node (the
    Jobs' own nodeSelector picks the GPU product)."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": KUEUE_FLAVOR, "labels": managed_labels()},
        "spec": {},
    }


def _limit_counts(counts: dict[str, int], what: str) -> dict[str, int]:
    return {
        check_resource(resource): checked_count(units, f"{what} of {resource}", minimum=0)
        for resource, units in counts.items()
    }


def cluster_queue_manifest(limits: TenantLimits) -> dict:
    """The ClusterQueue of a tenant in a cohort: its granted devices as nominal quota, of which
    it lends at most k8s_lending (never more than it holds) and borrows at most k8s_borrowing; a
    resource that neither names is neither lent nor borrowed. Only its own namespace feeds it.
    Preemption: it takes back what it lent from any borrower (reclaimWithinCohort Any), never
    preempts to borrow, and within itself lets higher priorities go first."""
    namespace = check_namespace(limits.account)
    lending = _limit_counts(limits.k8s_lending, "lending limit")
    borrowing = _limit_counts(limits.k8s_borrowing, "borrowing limit")
    nominal = gpu_counts(limits)
    resources = []
    for name in sorted({*nominal, *lending, *borrowing}):
        held = nominal.get(name, 0)
        resources.append(
            {
                "name": name,
                "nominalQuota": str(held),
                "borrowingLimit": str(borrowing.get(name, 0)),
                "lendingLimit": str(min(lending.get(name, 0), held)),  # Kueue refuses more than nominal
            }
        )
    devices = [quota["name"] for quota in resources]
    caps = [
        cap
        for names in SLICE_RESOURCES.values()
        if names.count in devices
        for cap in (names.memory, names.cores)
        if cap and cap not in devices
    ]
    unbounded = [*UNBOUNDED_QUOTA.items(), *((cap, SLICE_CAP_QUOTA) for cap in caps)]
    for name, quota in unbounded:
        resources.append({"name": name, "nominalQuota": quota, "borrowingLimit": "0", "lendingLimit": "0"})
    if len(resources) > KUEUE_MAX_RESOURCES:
        raise BackendError(f"a Kueue resource group holds at most {KUEUE_MAX_RESOURCES} resources")
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ClusterQueue",
        "metadata": {
            "name": cluster_queue_name(namespace),
            "labels": managed_labels(**{LABEL_TENANT: namespace}),
        },
        "spec": {
            "cohort": check_cohort(limits.cohort),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {
                    "coveredResources": [quota["name"] for quota in resources],
                    "flavors": [{"name": KUEUE_FLAVOR, "resources": resources}],
                }
            ],
            "preemption": {
                "reclaimWithinCohort": "Any",
                "borrowWithinCohort": {"policy": "Never"},
                "withinClusterQueue": "LowerPriority",
            },
        },
    }


def workload_priority_class_manifests() -> list[dict]:
    """Kueue's priorities, named as the PriorityClasses: the Jobs' priority-class label names one."""
    return [
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name, "labels": managed_labels()},
            "value": value,
            "description": priority_description(name),
        }
        for name, value in [*TIERS.items(), (BORROW_CLASS, BORROW_VALUE)]
    ]
