"""The ClusterRole of the portal's service account."""

from __future__ import annotations

from clusters.backends.kubernetes.common import managed_labels
from clusters.backends.kubernetes.kueue import KUEUE_GROUP


def cluster_role_manifest(name: str = "gpu-portal") -> dict:
    """What the portal's service account needs, cluster-wide (the README lists the same rules)."""
    rules = [
        ("", ["namespaces", "resourcequotas", "limitranges"], ["get", "create", "update"]),
        ("", ["persistentvolumeclaims"], ["get", "create"]),
        ("", ["services"], ["create"]),
        ("", ["pods", "events", "nodes"], ["list"]),
        ("", ["pods/log"], ["get"]),
        ("batch", ["jobs"], ["get", "list", "create", "delete"]),
        ("networking.k8s.io", ["networkpolicies"], ["get", "create", "update"]),
        ("scheduling.k8s.io", ["priorityclasses"], ["get", "create", "update"]),
        # a LocalQueue's clusterQueue cannot change: it is deleted and made again; a tenant's
        # ClusterQueue goes when the tenant leaves its cohort
        (KUEUE_GROUP, ["localqueues", "clusterqueues"], ["get", "create", "update", "delete"]),
        (KUEUE_GROUP, ["workloadpriorityclasses", "resourceflavors"], ["get", "create", "update"]),
    ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": managed_labels()},
        "rules": [
            {"apiGroups": [group], "resources": resources, "verbs": verbs}
            for group, resources, verbs in rules
        ]
        + [{"nonResourceURLs": ["/version"], "verbs": ["get"]}],
    }
