"""Writes about clusters: their health and inventory as the backends report them."""

from django.conf import settings
from django.utils import timezone

from clusters import breaker
from clusters.backends import backend_for
from clusters.backends.base import Backend, BackendUnavailable, ClusterConfig
from clusters.breaker import ClusterUnavailable
from clusters.models import Cluster, ClusterKind, Partition
from clusters.signals import cluster_recovered
from portal.core.metrics import cluster_errors

# The transport a cluster's failures are counted under (portal_cluster_errors_total).
TRANSPORTS = {ClusterKind.SLURM: "ssh", ClusterKind.KUBERNETES: "api", ClusterKind.LOCAL: "local"}

# How long the half-open probe's lock is held at most: a health() is one SSH connect and one
# short command, each bounded by the backend's timeouts.
PROBE_HOLD_S = 60


def cluster_config(cluster: Cluster) -> ClusterConfig:
    """The plain data a backend needs; it carries secrets (decrypted as the row was read, in
    memory only), so it is never logged or returned."""
    return ClusterConfig(
        slug=cluster.slug,
        kind=cluster.kind,
        ssh_host=cluster.ssh_host,
        ssh_port=cluster.ssh_port,
        ssh_user=cluster.ssh_user,
        ssh_known_hosts=cluster.ssh_known_hosts,
        ssh_private_key=cluster.ssh_private_key,
        ssh_key_passphrase=cluster.ssh_key_passphrase,
        slurm_cluster_name=cluster.slurm_cluster_name,
        scratch_root=cluster.scratch_root,
        k8s_api_url=cluster.k8s_api_url,
        k8s_ca_cert=cluster.k8s_ca_cert,
        k8s_token=cluster.k8s_token,
        kubeconfig=cluster.kubeconfig,
        uses_kueue=cluster.uses_kueue,
        k8s_image=cluster.k8s_image,
        k8s_scratch_gib=cluster.k8s_scratch_gib,
        k8s_scratch_storage_class=cluster.k8s_scratch_storage_class,
        local_gpus=cluster.local_gpus,
        state_dir=str(settings.VAR_DIR / "local-cluster" / cluster.slug),
        nvidia_smi=settings.LOCAL_NVIDIA_SMI,
        local_sandbox_bwrap=settings.LOCAL_SANDBOX_BWRAP,
        local_sandbox_network=settings.LOCAL_SANDBOX_NETWORK,
        local_sandbox_uid_base=settings.LOCAL_SANDBOX_UID_BASE,
        local_sandbox_uid_count=settings.LOCAL_SANDBOX_UID_COUNT,
        local_sandbox_ro_paths=tuple(settings.LOCAL_SANDBOX_RO_PATHS),
        local_sandbox_hidden=(str(settings.BASE_DIR), str(settings.VAR_DIR)),
        local_tenant=settings.LOCAL_CLUSTER_TENANT,
        preempt_grace_s=settings.JOB_PREEMPT_GRACE_S,
    )


def backend_of(cluster: Cluster) -> Backend:
    return backend_for(cluster_config(cluster))


def cluster_mark_health(*, cluster: Cluster, healthy: bool, detail: str) -> None:
    """Record what the last contact with the cluster showed; the circuit breaker counts it."""
    Cluster.objects.filter(pk=cluster.pk).update(
        healthy=healthy, health_detail=detail[:500], health_checked_at=timezone.now()
    )
    cluster.healthy, cluster.health_detail = healthy, detail[:500]
    if healthy:
        cluster_answered(cluster=cluster)
    else:
        cluster_errors.labels(cluster.slug, TRANSPORTS.get(cluster.kind, cluster.kind)).inc()
        breaker.breaker_failure(cluster_id=cluster.pk, detail=detail)


def cluster_answered(*, cluster: Cluster, known: breaker.BreakerState | None = None) -> None:
    """The cluster answered (a dispatch or a poll went through): its breaker closes, and when it
    was open, the jobs that waited for it are told (clusters.signals.cluster_recovered)."""
    if breaker.breaker_success(cluster_id=cluster.pk, known=known):
        cluster_recovered.send(sender=Cluster, cluster_id=cluster.pk)


def cluster_available(*, cluster: Cluster) -> bool:
    """Whether calls may go to the cluster now: its breaker is closed, or its cool-off is over
    and this caller's probe (the backend's health(), bounded by its connect and command
    timeouts) found it answering. False at once while it cools off or another caller probes."""
    state = breaker.breaker_state(cluster_id=cluster.pk)
    if not state.open:
        return True
    if state.cooling or not breaker.breaker_probe_claim(cluster_id=cluster.pk, hold_s=PROBE_HOLD_S):
        return False
    try:
        health = backend_of(cluster).health()
        cluster_mark_health(cluster=cluster, healthy=health.healthy, detail=health.detail)
    finally:
        breaker.breaker_probe_release(cluster_id=cluster.pk)
    return health.healthy


def cluster_check_available(*, cluster: Cluster) -> None:
    """cluster_available, or ClusterUnavailable (a BackendUnavailable: callers wait and retry)."""
    if not cluster_available(cluster=cluster):
        raise ClusterUnavailable(f"{cluster.slug} is not answering; its circuit breaker is open")


def cluster_sync(*, cluster: Cluster) -> bool:
    """Ask the cluster how it is and what is free; record both. Returns whether it is healthy."""
    if not cluster_available(cluster=cluster):  # cooling off: not asked; it stays as last marked
        return False
    backend = backend_of(cluster)
    health = backend.health()
    cluster_mark_health(cluster=cluster, healthy=health.healthy, detail=health.detail)
    if not health.healthy:
        return False
    try:
        partitions = {info.name: info for info in backend.inventory()}
    except BackendUnavailable as exc:
        cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
        return False
    for partition in cluster.partitions.all():
        info = partitions.get(partition.name)
        Partition.objects.filter(pk=partition.pk).update(gpus_free=info.gpus_free if info else None)
    return True


def local_sandbox_warnings() -> list[str]:
    """/readyz's warning for each enabled local cluster that runs jobs without a sandbox (and so
    serves one tenant only). The reason, which names paths, is for the admin console only."""
    lines = []
    for cluster in Cluster.objects.filter(kind=ClusterKind.LOCAL, enabled=True).order_by("slug"):
        if not backend_of(cluster).sandbox.ok:
            lines.append(
                f"local cluster {cluster.slug}: no job sandbox, so it serves one tenant only "
                "(its page in the admin console says why)"
            )
    return lines
