"""The objects of a job: its batch/v1 Job (pod spec included) and, for several nodes, the headless
Service of its rendezvous; built by pure functions of plain data (see common.py).

What a job's share of a device is called on Kubernetes comes from clusters/shares.py: whole
devices by their device plugin's resource, MIG instances by the NVIDIA device plugin's mixed
strategy (`nvidia.com/mig-<profile>`), slices by HAMi's resources, placed by HAMi's scheduler.

Lending (docs/architecture/lending.md): a preemptible job's pods get SIGTERM and grace_s to save a
checkpoint in the tenant's scratch claim, and jobs on borrowed GPUs the lowest PriorityClass.
"""

from __future__ import annotations

import re
from typing import Any

from clusters import shares
from clusters.backends.base import BackendError, ClusterConfig, JobSpec
from clusters.backends.kubernetes.common import (
    BORROW_CLASS,
    CHECKPOINTS,
    GPU_RESOURCES,
    JOB_PREFIX,
    LABEL_TENANT,
    MANAGED_BY,
    MANAGED_BY_KEY,
    SCRATCH_CLAIM,
    SCRATCH_DIR,
    SCRATCH_VOLUME,
    TIERS,
    check_namespace,
    check_resource,
    check_token,
    checked_count,
    job_name,
    managed_labels,
)
from clusters.backends.kubernetes.kueue import (
    KUEUE_GROUP,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    LOCAL_QUEUE,
)
from clusters.shares import HAMI_SCHEDULER, SLICE_RESOURCES, ShareKind

LABEL_TOKEN = "gpu-portal/token"  # noqa: S105 (a label key, not a secret)
LABEL_JOB = "gpu-portal/job"
LABEL_SCENARIO = "gpu-portal/scenario"
ANNOTATION_NAME = "gpu-portal/name"
ANNOTATION_PRIORITY = "gpu-portal/priority"
CONTAINER = "job"
RDZV_PORT = 29500  # torchrun's c10d rendezvous
RUN_AS = 1000  # uid and gid of the job's processes: never root
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
PREEMPT_SIGNAL = "TERM"  # what a warned job's pods get first (PORTAL_PREEMPT_SIGNAL)
# A job that keeps checkpoints makes its checkpoint directory as itself (its uid, on whatever the
# claim's storage allows), then runs its script, unchanged, as the container's main process. A
# directory that cannot be made fails the job: an attempt that silently started again from
# nothing would be worse than one that says why.
CHECKPOINT_START = 'mkdir -p -- "$PORTAL_CHECKPOINT_DIR" || exit 1; exec /bin/bash -c "$1"'
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

# As the local backend takes it: one path component of letters, digits, "_", "." and "-", never
# "." or anything with "..".
_CHECKPOINT_KEY = re.compile(r"(?!\.\Z)(?!.*\.\.)[A-Za-z0-9_.-]{1,128}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIG_PROFILE = re.compile(r"[1-7]g\.[0-9]{1,4}gb")  # NVIDIA's <g>g.<memory>gb
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}")
_NOT_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


# ---------------------------------------------------------------- checks --
def check_checkpoint_key(key: str) -> str:
    if not isinstance(key, str) or not _CHECKPOINT_KEY.fullmatch(key):
        raise BackendError(
            f"checkpoint key {str(key)[:60]!r} is not 1 to 128 letters, digits, '_', '.' and '-' (no '..')"
        )
    return key


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


# -------------------------------------------------------------------- job --
def job_labels(spec: JobSpec) -> dict[str, str]:
    """Labels of the Job, its pods and its Service (Kueue's come on the Job only)."""
    labels = managed_labels(**{LABEL_TOKEN: check_token(spec.token)})
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
    units = checked_count(spec.gpus_per_node, "GPUs per node")
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
        memory_mib = checked_count(spec.gpu_memory_mib, "slice memory in MiB")
        unit_mib = names.memory_unit_mib
        if memory_mib % unit_mib:
            raise BackendError(f"{spec.vendor} slices take memory in steps of {unit_mib} MiB: {memory_mib}")
        if names.cores:
            cores_pct = checked_count(spec.gpu_cores_pct, "slice compute percentage")
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
    gpus = checked_count(spec.gpus_per_node, "GPUs per node")
    devices = share_resources(spec)
    nodes = checked_count(spec.nodes, "node count")
    walltime = checked_count(spec.walltime_minutes, "walltime")
    cpus = checked_count(spec.cpus_per_gpu, "CPUs per GPU") * gpus
    memory = checked_count(spec.mem_per_gpu_mb, "memory per GPU") * gpus
    image = spec.image or config.k8s_image
    if not _IMAGE.fullmatch(image or ""):
        raise BackendError(f"container image {str(image)[:80]!r} is not an image reference")
    product = label_value(spec.k8s_product)
    if not product or product != spec.k8s_product:
        raise BackendError(f"GPU product {spec.k8s_product[:80]!r} is not a node label value")
    if not isinstance(spec.script, str) or not spec.script.strip():
        raise BackendError("the job's script is empty")

    attempt = checked_count(spec.attempt, "attempt")
    grace_s = checked_count(spec.grace_s, "grace period in seconds", minimum=0) if spec.preemptible else None
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
        "ttlSecondsAfterFinished": checked_count(config.k8s_job_ttl_s, "Job TTL", minimum=0),
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
