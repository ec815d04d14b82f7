"""Every object the Kubernetes backend writes, built by pure functions of plain data.

TenantLimits/JobSpec/ClusterConfig in, manifest dicts out: no API call here, so that the tests
validate each manifest against the Kubernetes schemas of every version in KUBERNETES_VERSIONS.
Names and values that come from the portal are checked here too (BackendError on a bad one).

What a job's share of a device is called on Kubernetes comes from clusters/shares.py: whole
devices by their device plugin's resource, MIG instances by the NVIDIA device plugin's mixed
strategy (`nvidia.com/mig-<profile>`), slices by HAMi's resources, placed by HAMi's scheduler.

Lending (docs/architecture/lending.md): a preemptible job's pods get SIGTERM and grace_s to save a
checkpoint in the tenant's scratch claim, jobs on borrowed GPUs the lowest PriorityClass, and on
Kueue clusters a tenant in a cohort its own ClusterQueue with the cohort's lending limits.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from clusters import shares
from clusters.backends.base import BackendError, ClusterConfig, JobSpec, TenantLimits
from clusters.shares import HAMI_SCHEDULER, SLICE_RESOURCES, ShareKind

# The Kubernetes versions the backend's manifests are valid for (validated by the tests).
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

MANAGED_BY_KEY, MANAGED_BY = "app.kubernetes.io/managed-by", "gpu-portal"
MANAGED_SELECTOR = f"{MANAGED_BY_KEY}={MANAGED_BY}"
LABEL_TOKEN = "gpu-portal/token"  # noqa: S105 (a label key, not a secret)
LABEL_TENANT = "gpu-portal/tenant"
LABEL_JOB = "gpu-portal/job"
LABEL_SCENARIO = "gpu-portal/scenario"
ANNOTATION_NAME = "gpu-portal/name"
ANNOTATION_PRIORITY = "gpu-portal/priority"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
LOCAL_QUEUE = "portal"  # the LocalQueue of every tenant namespace
OBJECT_NAME = "gpu-portal"  # the ResourceQuota and LimitRange of a tenant namespace
NETWORK_POLICY = "gpu-portal-deny-other-namespaces"
JOB_PREFIX = "pj-"
CONTAINER = "job"
RDZV_PORT = 29500  # torchrun's c10d rendezvous
RUN_AS = 1000  # uid and gid of the job's processes: never root
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
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
PREEMPT_SIGNAL = "TERM"  # what a warned job's pods get first (PORTAL_PREEMPT_SIGNAL)
# A job that keeps checkpoints makes its checkpoint directory as itself (its uid, on whatever the
# claim's storage allows), then runs its script, unchanged, as the container's main process. A
# directory that cannot be made fails the job: an attempt that silently started again from
# nothing would be worse than one that says why.
CHECKPOINT_START = 'mkdir -p -- "$PORTAL_CHECKPOINT_DIR" || exit 1; exec /bin/bash -c "$1"'
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
# GPU extended resource → the node label that names the GPU product (NVIDIA GPU feature
# discovery, AMD node labeller; the Cambricon and Hygon ones as their labellers set them).
GPU_RESOURCES = {
    "nvidia.com/gpu": "nvidia.com/gpu.product",
    "amd.com/gpu": "amd.com/gpu.product-name",
    "cambricon.com/mlu": "cambricon.com/mlu.model",
    "hygon.com/dcunum": "hygon.com/dcu.model",
}
# The accelerator vendors a job may name (JobSpec.vendor), and the shares Kubernetes can give.
VENDORS = tuple(shares.VISIBLE_DEVICES)
SHARES = tuple(shares.KINDS_BY_CLUSTER["kubernetes"])
# Environment variables the backend sets itself: a job's own value for one of them is dropped.
RESERVED_ENV = frozenset(
    {
        "PORTAL_RDZV_HOST",
        "JOB_COMPLETION_INDEX",
        "PORTAL_ATTEMPT",
        "PORTAL_PREEMPT_SIGNAL",
        "PORTAL_CHECKPOINT_DIR",
    }
)

_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
# As the local backend takes it: one path component of letters, digits, "_", "." and "-", never
# "." or anything with "..".
_CHECKPOINT_KEY = re.compile(r"(?!\.\Z)(?!.*\.\.)[A-Za-z0-9_.-]{1,128}")
_TOKEN = re.compile(r"[a-z0-9]{1,40}")  # "pj-" + token stays a DNS-1035 label, "-<index>" included
_JOB_NAME = re.compile(rf"{JOB_PREFIX}[a-z0-9]{{1,40}}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESOURCE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]{1,4}gb")  # NVIDIA's <g>g.<memory>gb
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}")
_NOT_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


# ---------------------------------------------------------------- checks --
def check_namespace(account: str) -> str:
    if not isinstance(account, str) or not _DNS_LABEL.fullmatch(account):
        raise BackendError(f"namespace {str(account)[:70]!r} is not a DNS label")
    if account == "default" or account.startswith("kube-"):
        raise BackendError(f"namespace {account!r} is reserved by Kubernetes, not a tenant's")
    return account


def check_token(token: str) -> str:
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise BackendError(f"job token {str(token)[:50]!r} is not 1 to 40 lowercase letters and digits")
    return token


def check_checkpoint_key(key: str) -> str:
    if not isinstance(key, str) or not _CHECKPOINT_KEY.fullmatch(key):
        raise BackendError(
            f"checkpoint key {str(key)[:60]!r} is not 1 to 128 letters, digits, '_', '.' and '-' (no '..')"
        )
    return key


def check_cohort(cohort: str) -> str:
    if not isinstance(cohort, str) or not _DNS_SUBDOMAIN.fullmatch(cohort):
        raise BackendError(f"Kueue cohort {str(cohort)[:70]!r} is not a DNS subdomain")
    return cohort


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
    if not isinstance(name, str) or not _RESOURCE.fullmatch(name):
        raise BackendError(f"{str(name)[:80]!r} is not an extended resource name (vendor.com/name)")
    return name


def _count(value: int, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(f"{what} must be an integer ≥ {minimum}, not {value!r}")
    return value


def label_value(value: Any) -> str:
    """A valid label value (≤ 63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    text = _NOT_LABEL_VALUE.sub("-", str(value)).strip("._-")[:63]
    return text.rstrip("._-")


def product_label(resource: str) -> str:
    """The node label key that names the product of GPU resource `resource`."""
    return GPU_RESOURCES.get(resource) or f"{resource.split('/')[0]}/gpu.product"


def literal(text: str) -> str:
    """Text that Kubernetes' $(VAR) expansion of command, args and env values leaves as it is:
    it turns "$$" into "$" and "$(NAME)" into NAME's value, so every "$" goes doubled."""
    return text.replace("$", "$$")


def env_entries(env: dict[str, str]) -> list[dict[str, str]]:
    """The job's environment as container env entries: names checked, values passed as data."""
    entries = []
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise BackendError(f"environment variable name {str(name)[:64]!r} is not [A-Za-z_][A-Za-z0-9_]*")
        text = str(value)
        if "\x00" in text:
            raise BackendError(f"environment variable {name} holds a NUL character")
        if name not in RESERVED_ENV:
            entries.append({"name": name, "value": literal(text)})
    return entries


# ----------------------------------------------------------------- tenant --
def _managed(**extra: str) -> dict[str, str]:
    return {MANAGED_BY_KEY: MANAGED_BY, **extra}


def _gpu_counts(limits: TenantLimits) -> dict[str, int]:
    """Every known GPU resource and every granted one (whole devices, MIG instances, HAMi's
    shared devices…) → units granted (0 without a grant), so that a grant taken away takes its
    units away too; a granted resource that is not known here is kept at 0 by keep_revoked."""
    counts = dict.fromkeys(GPU_RESOURCES, 0)
    for resource, units in limits.k8s_resources.items():
        counts[check_resource(resource)] = _count(units, f"units of {resource}", minimum=0)
    return dict(sorted(counts.items()))


def is_extended(name: str) -> bool:
    """Whether `name` is an extended resource (a device plugin's, HAMi's): a domain of its own,
    outside kubernetes.io, as Kubernetes tells them from its native resources."""
    domain, slash, _name = name.partition("/")
    native = domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    return bool(slash) and not native and not name.startswith("requests.") and bool(_RESOURCE.fullmatch(name))


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
    labels = _managed(**{LABEL_TENANT: namespace, "pod-security.kubernetes.io/enforce": "restricted"})
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}


def resource_quota_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    hard = {f"requests.{resource}": str(gpus) for resource, gpus in _gpu_counts(limits).items()}
    hard["count/jobs.batch"] = str(_count(config.k8s_max_jobs_per_tenant, "jobs per tenant", minimum=0))
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": OBJECT_NAME, "namespace": check_namespace(limits.account), "labels": _managed()},
        "spec": {"hard": hard},
    }


def limit_range_manifest(limits: TenantLimits) -> dict:
    """GPUs per container at most what the tenant holds; default 0, because a LimitRange's
    default limit is otherwise its max, which would give every container GPUs."""
    counts = _gpu_counts(limits)
    item = {
        "type": "Container",
        "max": {resource: str(gpus) for resource, gpus in counts.items()},
        "default": dict.fromkeys(counts, "0"),
        "defaultRequest": dict.fromkeys(counts, "0"),
    }
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": OBJECT_NAME, "namespace": check_namespace(limits.account), "labels": _managed()},
        "spec": {"limits": [item]},
    }


def _priority_description(name: str) -> str:
    if name == BORROW_CLASS:
        return "GPU portal jobs on GPUs borrowed in a cohort: preempted first"
    return f"GPU portal tier {name.removeprefix('portal-')}"


def priority_class_manifests() -> list[dict]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": _managed()},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never" if name in NEVER_PREEMPT else "PreemptLowerPriority",
            "description": _priority_description(name),
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
            "labels": _managed(),
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]},
    }


def scratch_claim_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    """The tenant's scratch, shared by its jobs' pods on any node (ReadWriteMany): where their
    checkpoints outlive the pods of an attempt. Created once and then left as it is (see
    KubernetesBackend._ensure): its class and access modes cannot change, its size only grow."""
    gib = _count(config.k8s_scratch_gib, "scratch size in GiB")
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": f"{gib}Gi"}},
    }
    if storage_class := config.k8s_scratch_storage_class:
        if not _DNS_SUBDOMAIN.fullmatch(storage_class):
            raise BackendError(f"StorageClass {storage_class[:70]!r} is not a DNS subdomain")
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": SCRATCH_CLAIM,
            "namespace": check_namespace(limits.account),
            "labels": _managed(),
        },
        "spec": spec,
    }


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
        if not _DNS_LABEL.fullmatch(cluster_queue or ""):
            raise BackendError(f"Kueue ClusterQueue name {cluster_queue[:70]!r} is not a DNS label")
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": check_namespace(limits.account), "labels": _managed()},
        "spec": {"clusterQueue": cluster_queue},
    }


def resource_flavor_manifest() -> dict:
    """The one flavor of the tenants' ClusterQueues: no node labels, so it fits every node (the
    Jobs' own nodeSelector picks the GPU product)."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": KUEUE_FLAVOR, "labels": _managed()},
        "spec": {},
    }


def _limit_counts(counts: dict[str, int], what: str) -> dict[str, int]:
    return {
        check_resource(resource): _count(units, f"{what} of {resource}", minimum=0)
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
    nominal = _gpu_counts(limits)
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
        "metadata": {"name": cluster_queue_name(namespace), "labels": _managed(**{LABEL_TENANT: namespace})},
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
            "metadata": {"name": name, "labels": _managed()},
            "value": value,
            "description": _priority_description(name),
        }
        for name, value in [*TIERS.items(), (BORROW_CLASS, BORROW_VALUE)]
    ]


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
    if _count(config.k8s_scratch_gib, "scratch size in GiB", minimum=0):
        manifests.append(scratch_claim_manifest(limits, config))
    if config.uses_kueue:
        manifests.append(local_queue_manifest(limits, config))
    return manifests


# -------------------------------------------------------------------- job --
def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels of the Job, its pods and its Service (Kueue's come on the Job only)."""
    labels = _managed(**{LABEL_TOKEN: check_token(spec.token)})
    for key, label in (("tenant", LABEL_TENANT), ("job", LABEL_JOB), ("scenario", LABEL_SCENARIO)):
        if value := label_value(spec.labels.get(key, "")):
            labels[label] = value
    return labels


def share_resources(spec: JobSpec) -> dict[str, str]:
    """The extended resources of one pod of the job (its container requests and limits them
    alike, as Kubernetes wants of extended resources), by the job's share: a whole device of the
    model's resource, MIG instances `nvidia.com/mig-<profile>`, or one HAMi slice (a shared
    device with its memory cap and compute percentage). Shards are Slurm's alone."""
    resource = check_resource(spec.k8s_resource)
    units = _count(spec.gpus_per_node, "GPUs per node")
    if spec.vendor not in VENDORS:
        raise BackendError(f"accelerator vendor {str(spec.vendor)[:40]!r} is not one of {', '.join(VENDORS)}")
    if spec.share == ShareKind.SHARD:
        raise BackendError(
            "shards are Slurm's gres/shard: Kubernetes has no shard of a device; "
            "ask for a slice (HAMi caps its memory and compute) or a MIG instance"
        )
    if spec.share not in SHARES:
        raise BackendError(f"share {str(spec.share)[:40]!r} is not one of {', '.join(SHARES)}")
    memory_mib = cores_pct = 0
    if spec.share == ShareKind.MIG:
        if spec.vendor != "nvidia":
            raise BackendError(f"MIG instances are NVIDIA's: {spec.vendor} devices have none")
        if not isinstance(spec.mig_profile, str) or not _MIG_PROFILE.fullmatch(spec.mig_profile):
            raise BackendError(f"MIG profile {str(spec.mig_profile)[:40]!r} is not <g>g.<memory>gb (3g.71gb)")
    elif spec.share == ShareKind.SLICE:
        names = SLICE_RESOURCES.get(spec.vendor)
        if names is None:
            raise BackendError(f"{spec.vendor} devices have no shared slices on Kubernetes (HAMi)")
        if units != 1:
            raise BackendError(
                f"a slice is one shared device per pod, not {units}: ask for more nodes, or whole devices"
            )
        memory_mib = _count(spec.gpu_memory_mib, "slice memory in MiB")
        unit_mib = names.memory_unit_mib
        if memory_mib % unit_mib:
            raise BackendError(f"{spec.vendor} slices take memory in steps of {unit_mib} MiB: {memory_mib}")
        if names.cores:
            cores_pct = _count(spec.gpu_cores_pct, "slice compute percentage")
            if cores_pct > 100:
                raise BackendError(f"a slice's compute percentage is at most 100, not {cores_pct}")
    try:
        found = shares.k8s_pod_resources(
            vendor=spec.vendor,
            resource=resource,
            kind=spec.share,
            per_node=units,
            mig_profile=spec.mig_profile,
            memory_mib=memory_mib,
            cores_pct=cores_pct,
        )
    except ValueError as exc:
        raise BackendError(str(exc)) from exc
    return {check_resource(name): str(count) for name, count in found.items()}


def rendezvous_host(namespace: str, name: str) -> str:
    """The DNS name of pod 0 of an Indexed Job whose pods have `subdomain` = the Job's name."""
    return f"{name}-0.{name}.{namespace}.svc"


def job_manifest(spec: JobSpec, config: ClusterConfig) -> dict:
    """The batch/v1 Job of one portal job; Indexed, with a rendezvous host, for several nodes.

    Every job gets PORTAL_ATTEMPT and PORTAL_PREEMPT_SIGNAL; one with a checkpoint key the
    tenant's scratch claim at /scratch and PORTAL_CHECKPOINT_DIR, made before its script runs; a
    preemptible one terminationGracePeriodSeconds = grace_s (SIGTERM to the container's main
    process, its shell, then SIGKILL once the grace is out); one on borrowed GPUs the lowest
    priority (BORROW_CLASS)."""
    namespace, name = check_namespace(spec.account), job_name(spec.token)
    resource = check_resource(spec.k8s_resource)
    if spec.qos not in TIERS:
        raise BackendError(f"tier {spec.qos[:40]!r} is not one of {', '.join(TIERS)}")
    gpus = _count(spec.gpus_per_node, "GPUs per node")
    devices = share_resources(spec)
    nodes = _count(spec.nodes, "node count")
    walltime = _count(spec.walltime_minutes, "walltime")
    cpus = _count(spec.cpus_per_gpu, "CPUs per GPU") * gpus
    memory = _count(spec.mem_per_gpu_mb, "memory per GPU") * gpus
    image = spec.image or config.k8s_image
    if not _IMAGE.fullmatch(image or ""):
        raise BackendError(f"container image {str(image)[:80]!r} is not an image reference")
    product = label_value(spec.k8s_product)
    if not product or product != spec.k8s_product:
        raise BackendError(f"GPU product {spec.k8s_product[:80]!r} is not a node label value")
    if not isinstance(spec.script, str) or not spec.script.strip():
        raise BackendError("the job's script is empty")

    attempt = _count(spec.attempt, "attempt")
    grace_s = _count(spec.grace_s, "grace period in seconds", minimum=0) if spec.preemptible else None
    priority_class = BORROW_CLASS if spec.borrowing else spec.qos

    env = env_entries(spec.env)
    if "HOME" not in spec.env:  # the uid has no home in the image: the writable work directory
        env.insert(0, {"name": "HOME", "value": "/work"})
    env += [
        {"name": "PORTAL_ATTEMPT", "value": str(attempt)},
        {"name": "PORTAL_PREEMPT_SIGNAL", "value": PREEMPT_SIGNAL},
    ]
    command = ["/bin/bash", "-c", literal(spec.script)]
    mounts = [
        {"name": "work", "mountPath": "/work"},
        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (in the container)
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "work", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    if spec.checkpoint_key:
        key = check_checkpoint_key(spec.checkpoint_key)
        if not config.k8s_scratch_gib:
            raise BackendError(
                "this cluster keeps no scratch volume (scratch size 0), so no checkpoint directory: "
                "give it a scratch size, or submit the job without checkpoints"
            )
        env.append({"name": "PORTAL_CHECKPOINT_DIR", "value": literal(f"{SCRATCH_DIR}/{CHECKPOINTS}/{key}")})
        command = ["/bin/bash", "-c", literal(CHECKPOINT_START), "portal-job", literal(spec.script)]
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR})
        volumes.append({"name": SCRATCH_VOLUME, "persistentVolumeClaim": {"claimName": SCRATCH_CLAIM}})
    labels = job_labels(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority_class,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {product_label(resource): product},
        "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "workingDir": "/work",
                "env": env,
                "resources": {
                    "requests": {"cpu": str(cpus), "memory": f"{memory}Mi", **devices},
                    "limits": {"cpu": str(cpus), "memory": f"{memory}Mi", **devices},
                },
                "securityContext": {
                    "runAsNonRoot": True,
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if grace_s is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace_s
    if spec.share == ShareKind.SLICE:  # HAMi's scheduler places slices and enforces their caps
        pod_spec["schedulerName"] = HAMI_SCHEDULER
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": walltime * 60,
        "ttlSecondsAfterFinished": _count(config.k8s_job_ttl_s, "Job TTL", minimum=0),
        "completions": nodes,
        "parallelism": nodes,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    if nodes > 1:
        job_spec["completionMode"] = "Indexed"
        pod_spec["subdomain"] = name
        env.append({"name": "PORTAL_RDZV_HOST", "value": rendezvous_host(namespace, name)})
    job_labels_ = dict(labels)
    if config.uses_kueue:
        job_spec["suspend"] = True  # Kueue admits it by unsuspending it
        job_labels_ |= {KUEUE_QUEUE_LABEL: LOCAL_QUEUE, KUEUE_PRIORITY_LABEL: priority_class}
    annotations = {ANNOTATION_NAME: str(spec.name)[:253], ANNOTATION_PRIORITY: label_value(spec.priority)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels_, "annotations": annotations},
        "spec": job_spec,
    }


def rendezvous_service_manifest(namespace: str, name: str, labels: dict[str, str], job_uid: str = "") -> dict:
    """The headless Service that gives the pods of Indexed Job `name` their DNS names; owned by
    the Job (when its uid is known), so that deleting the Job deletes it."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {key: value for key, value in labels.items() if not key.startswith(f"{KUEUE_GROUP}/")},
    }
    if job_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid}
        ]
    token = labels.get(LABEL_TOKEN) or name.removeprefix(JOB_PREFIX)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {MANAGED_BY_KEY: MANAGED_BY, LABEL_TOKEN: token},
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def job_manifests(spec: JobSpec, config: ClusterConfig, job_uid: str = "") -> list[dict]:
    """The Job, and for several nodes the rendezvous Service after it."""
    job = job_manifest(spec, config)
    if spec.nodes <= 1:
        return [job]
    meta = job["metadata"]
    return [job, rendezvous_service_manifest(meta["namespace"], meta["name"], meta["labels"], job_uid)]


# ------------------------------------------------------------------- RBAC --
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
        "metadata": {"name": name, "labels": _managed()},
        "rules": [
            {"apiGroups": [group], "resources": resources, "verbs": verbs}
            for group, resources, verbs in rules
        ]
        + [{"nonResourceURLs": ["/version"], "verbs": ["get"]}],
    }
