"""Writes about clusters: their health and inventory as the backends report them."""

from django.conf import settings
from django.utils import timezone

from clusters.backends import backend_for
from clusters.backends.base import Backend, ClusterConfig
from clusters.models import Cluster


def cluster_config(cluster: Cluster) -> ClusterConfig:
    """The plain data a backend needs; it carries secrets, so it is never logged or returned."""
    return ClusterConfig(
        slug=cluster.slug,
        kind=cluster.kind,
        ssh_host=cluster.ssh_host,
        ssh_port=cluster.ssh_port,
        ssh_user=cluster.ssh_user,
        ssh_known_hosts=cluster.ssh_known_hosts,
        ssh_private_key=cluster.ssh_private_key,
        slurm_cluster_name=cluster.slurm_cluster_name,
        scratch_root=cluster.scratch_root,
        k8s_api_url=cluster.k8s_api_url,
        k8s_ca_cert=cluster.k8s_ca_cert,
        k8s_token=cluster.k8s_token,
        kubeconfig=cluster.kubeconfig,
        uses_kueue=cluster.uses_kueue,
        local_gpus=cluster.local_gpus,
        state_dir=str(settings.VAR_DIR / "local-cluster" / cluster.slug),
    )


def backend_of(cluster: Cluster) -> Backend:
    return backend_for(cluster_config(cluster))


def cluster_mark_health(*, cluster: Cluster, healthy: bool, detail: str) -> None:
    """Record what the last contact with the cluster showed. A conditional update: the flag
    flips once, not on every poll."""
    Cluster.objects.filter(pk=cluster.pk).update(
        healthy=healthy, health_detail=detail[:500], health_checked_at=timezone.now()
    )
    cluster.healthy, cluster.health_detail = healthy, detail[:500]
