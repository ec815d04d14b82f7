"""The Kubernetes backend: batch/v1 Jobs in a namespace per tenant (docs/architecture.md, Backends).

manifests.py builds every object from plain data (pure functions), states.py maps a Job and its
pods to the portal's states, client.py holds the connection on the official `kubernetes` client,
backend.py ties them together.

The portal's service account needs the rules of manifests.cluster_role_manifest() (README).
"""

from clusters.backends.kubernetes.backend import KubernetesBackend
from clusters.backends.kubernetes.manifests import KUBERNETES_VERSIONS

__all__ = ["KUBERNETES_VERSIONS", "KubernetesBackend"]
