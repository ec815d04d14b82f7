"""What every manifest of the Kubernetes backend shares: labels, names, tiers, the scratch
claim's names, and the checks of names and values that come from the portal.

The manifests are built by pure functions of plain data (tenant.py, kueue.py, manifests.py,
rbac.py): TenantLimits/JobSpec/ClusterConfig in, manifest dicts out, no API call, so that the tests
validate each manifest against the Kubernetes schemas of every version in KUBERNETES_VERSIONS.
Names and values that come from the portal are checked here too (BackendError on a bad one).
"""

from __future__ import annotations

import re

from clusters.backends.base import BackendError, TenantLimits

# The Kubernetes versions the backend's manifests are valid for (validated by the tests).
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

MANAGED_BY_KEY, MANAGED_BY = "app.kubernetes.io/managed-by", "gpu-portal"
MANAGED_SELECTOR = f"{MANAGED_BY_KEY}={MANAGED_BY}"
LABEL_TENANT = "gpu-portal/tenant"
JOB_PREFIX = "pj-"
# One PriorityClass (and, on Kueue clusters, WorkloadPriorityClass) per tenant tier, and one for
# jobs on borrowed GPUs: below every tier, so that the scheduler preempts them first, and never
# preempting anything itself.
TIERS = {"portal-low": 1_000, "portal-normal": 10_000, "portal-high": 100_000, "portal-critical": 1_000_000}
BORROW_CLASS, BORROW_VALUE = "portal-borrow", 100
NEVER_PREEMPT = frozenset({"portal-low", BORROW_CLASS})
# Each tenant namespace's scratch claim, mounted at SCRATCH_DIR in the pods of jobs that keep
# checkpoints (PORTAL_CHECKPOINT_DIR = SCRATCH_DIR/checkpoints/<checkpoint key>).
SCRATCH_CLAIM, SCRATCH_VOLUME = "portal-scratch", "scratch"
SCRATCH_DIR, CHECKPOINTS = "/scratch", "checkpoints"
# GPU extended resource → the node label that names the GPU product (NVIDIA GPU feature
# discovery, AMD node labeller; the Cambricon and Hygon ones as their labellers set them).
GPU_RESOURCES = {
    "nvidia.com/gpu": "nvidia.com/gpu.product",
    "amd.com/gpu": "amd.com/gpu.product-name",
    "cambricon.com/mlu": "cambricon.com/mlu.model",
    "hygon.com/dcunum": "hygon.com/dcu.model",
}

DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_TOKEN = re.compile(r"[a-z0-9]{1,40}")  # "pj-" + token stays a DNS-1035 label, "-<index>" included
_JOB_NAME = re.compile(rf"{JOB_PREFIX}[a-z0-9]{{1,40}}")
RESOURCE_NAME = re.compile(
    r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
)


# ---------------------------------------------------------------- checks --
def check_namespace(account: str) -> str:
    if not isinstance(account, str) or not DNS_LABEL.fullmatch(account):
        raise BackendError(f"namespace {str(account)[:70]!r} is not a DNS label")
    if account == "default" or account.startswith("kube-"):
        raise BackendError(f"namespace {account!r} is reserved by Kubernetes, not a tenant's")
    return account


def check_token(token: str) -> str:
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise BackendError(f"job token {str(token)[:50]!r} is not 1 to 40 lowercase letters and digits")
    return token


def job_name(token: str) -> str:
    return JOB_PREFIX + check_token(token)


def backend_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_backend_id(value: str) -> tuple[str, str]:
    """'<namespace>/<job name>' → (namespace, name)."""
    namespace, _slash, name = str(value).partition("/")
    if not _slash or not _JOB_NAME.fullmatch(name):
        raise BackendError(f"{str(value)[:110]!r} is not a Kubernetes job id (namespace/pj-<token>)")
    return check_namespace(namespace), name


def check_resource(name: str) -> str:
    if not isinstance(name, str) or not RESOURCE_NAME.fullmatch(name):
        raise BackendError(f"{str(name)[:80]!r} is not an extended resource name (vendor.com/name)")
    return name


def checked_count(value: int, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(f"{what} must be an integer ≥ {minimum}, not {value!r}")
    return value


# ---------------------------------------------------------------- objects --
def managed_labels(**extra: str) -> dict[str, str]:
    return {MANAGED_BY_KEY: MANAGED_BY, **extra}


def gpu_counts(limits: TenantLimits) -> dict[str, int]:
    """Every known GPU resource and every granted one (whole devices, MIG instances, HAMi's
    shared devices…) → units granted (0 without a grant), so that a grant taken away takes its
    units away too; a granted resource that is not known here is kept at 0 by keep_revoked."""
    counts = dict.fromkeys(GPU_RESOURCES, 0)
    for resource, units in limits.k8s_resources.items():
        counts[check_resource(resource)] = checked_count(units, f"units of {resource}", minimum=0)
    return dict(sorted(counts.items()))


def priority_description(name: str) -> str:
    if name == BORROW_CLASS:
        return "GPU portal jobs on GPUs borrowed in a cohort: preempted first"
    return f"GPU portal tier {name.removeprefix('portal-')}"
