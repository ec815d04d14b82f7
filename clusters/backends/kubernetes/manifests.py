"""Every object the Kubernetes backend writes, built by pure functions of plain data.

TenantLimits/JobSpec/ClusterConfig in, manifest dicts out: no API call here, so that the tests
validate each manifest against the Kubernetes schemas of every version in KUBERNETES_VERSIONS.
Names and values that come from the portal are checked here too (BackendError on a bad one).
"""

from __future__ import annotations

import re
from typing import Any

from clusters.backends.base import BackendError, ClusterConfig, JobSpec, TenantLimits

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
# One PriorityClass (and, on Kueue clusters, WorkloadPriorityClass) per tenant tier.
TIERS = {"portal-low": 1_000, "portal-normal": 10_000, "portal-high": 100_000, "portal-critical": 1_000_000}
# GPU extended resource → the node label that names the GPU product (NVIDIA GPU feature
# discovery, AMD node labeller; the Cambricon and Hygon ones as their labellers set them).
GPU_RESOURCES = {
    "nvidia.com/gpu": "nvidia.com/gpu.product",
    "amd.com/gpu": "amd.com/gpu.product-name",
    "cambricon.com/mlu": "cambricon.com/mlu.model",
    "hygon.com/dcunum": "hygon.com/dcu.model",
}
# Environment variables the backend sets itself: a job's own value for one of them is dropped.
RESERVED_ENV = frozenset({"PORTAL_RDZV_HOST", "JOB_COMPLETION_INDEX"})

_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_TOKEN = re.compile(r"[a-z0-9]{1,40}")  # "pj-" + token stays a DNS-1035 label, "-<index>" included
_JOB_NAME = re.compile(rf"{JOB_PREFIX}[a-z0-9]{{1,40}}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESOURCE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
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
    """Every known GPU resource and every granted one → GPUs granted (0 without a grant), so
    that a grant taken away takes its GPUs away too."""
    counts = dict.fromkeys(GPU_RESOURCES, 0)
    for resource, gpus in limits.k8s_resources.items():
        counts[check_resource(resource)] = _count(gpus, f"GPUs of {resource}", minimum=0)
    return dict(sorted(counts.items()))


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


def priority_class_manifests() -> list[dict]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": _managed()},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never" if name == "portal-low" else "PreemptLowerPriority",
            "description": f"GPU portal tier {name.removeprefix('portal-')}",
        }
        for name, value in TIERS.items()
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


def local_queue_manifest(limits: TenantLimits, config: ClusterConfig) -> dict:
    cluster_queue = config.k8s_kueue_cluster_queue
    if not _DNS_LABEL.fullmatch(cluster_queue or ""):
        raise BackendError(f"Kueue ClusterQueue name {cluster_queue[:70]!r} is not a DNS label")
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": check_namespace(limits.account), "labels": _managed()},
        "spec": {"clusterQueue": cluster_queue},
    }


def workload_priority_class_manifests() -> list[dict]:
    """Kueue's priorities, named as the PriorityClasses: the Jobs' priority-class label names one."""
    return [
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name, "labels": _managed()},
            "value": value,
            "description": f"GPU portal tier {name.removeprefix('portal-')}",
        }
        for name, value in TIERS.items()
    ]


def tenant_manifests(limits: TenantLimits, config: ClusterConfig) -> list[dict]:
    """Everything apply_tenant keeps in step, in the order it writes them."""
    if limits.qos not in TIERS:
        raise BackendError(f"tier {limits.qos[:40]!r} is not one of {', '.join(TIERS)}")
    manifests = priority_class_manifests()
    if config.uses_kueue:
        manifests += workload_priority_class_manifests()
    manifests += [
        namespace_manifest(limits),
        resource_quota_manifest(limits, config),
        limit_range_manifest(limits),
        network_policy_manifest(limits),
    ]
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


def rendezvous_host(namespace: str, name: str) -> str:
    """The DNS name of pod 0 of an Indexed Job whose pods have `subdomain` = the Job's name."""
    return f"{name}-0.{name}.{namespace}.svc"


def job_manifest(spec: JobSpec, config: ClusterConfig) -> dict:
    """The batch/v1 Job of one portal job; Indexed, with a rendezvous host, for several nodes."""
    namespace, name = check_namespace(spec.account), job_name(spec.token)
    resource = check_resource(spec.k8s_resource)
    if spec.qos not in TIERS:
        raise BackendError(f"tier {spec.qos[:40]!r} is not one of {', '.join(TIERS)}")
    gpus = _count(spec.gpus_per_node, "GPUs per node")
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

    env = env_entries(spec.env)
    if "HOME" not in spec.env:  # the uid has no home in the image: the writable work directory
        env.insert(0, {"name": "HOME", "value": "/work"})
    labels = job_labels(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": spec.qos,
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
                "command": ["/bin/bash", "-c", literal(spec.script)],
                "workingDir": "/work",
                "env": env,
                "resources": {
                    "requests": {"cpu": str(cpus), "memory": f"{memory}Mi", resource: str(gpus)},
                    "limits": {"cpu": str(cpus), "memory": f"{memory}Mi", resource: str(gpus)},
                },
                "securityContext": {
                    "runAsNonRoot": True,
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "work", "mountPath": "/work"},
                    {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (in the container)
                ],
            }
        ],
        "volumes": [{"name": "work", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
    }
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
        job_labels_ |= {KUEUE_QUEUE_LABEL: LOCAL_QUEUE, KUEUE_PRIORITY_LABEL: spec.qos}
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
        ("", ["services"], ["create"]),
        ("", ["pods", "events", "nodes"], ["list"]),
        ("", ["pods/log"], ["get"]),
        ("batch", ["jobs"], ["get", "list", "create", "delete"]),
        ("networking.k8s.io", ["networkpolicies"], ["get", "create", "update"]),
        ("scheduling.k8s.io", ["priorityclasses"], ["get", "create", "update"]),
        (KUEUE_GROUP, ["localqueues", "workloadpriorityclasses"], ["get", "create", "update"]),
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
