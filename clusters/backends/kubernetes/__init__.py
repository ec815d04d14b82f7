"""The Kubernetes backend: batch/v1 Jobs in a namespace per tenant (docs/architecture.md, Backends).

The manifests are built from plain data by pure functions: common.py (labels, names, checks),
tenant.py (a tenant's namespace and its objects), kueue.py (Kueue's queues, flavor and priorities),
manifests.py (a job's Job and rendezvous Service), rbac.py (the portal's ClusterRole). states.py
maps a Job and its pods to the portal's states, client.py holds the connection on the official
`kubernetes` client, backend.py ties them together.

The portal's service account needs the rules of rbac.cluster_role_manifest() (README).
"""

from clusters.backends.kubernetes.backend import KubernetesBackend
from clusters.backends.kubernetes.common import KUBERNETES_VERSIONS

__all__ = ["KUBERNETES_VERSIONS", "KubernetesBackend"]
