"""clusters.services.cluster_sync: health and free GPUs from the backend, onto the partitions."""

import pytest

from clusters.services import cluster_sync
from tests.factories import ClusterFactory, PartitionFactory

pytestmark = pytest.mark.django_db


def test_local_cluster_reports_its_free_gpus_and_health(catalog, client_for, member, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    cluster = ClusterFactory(slug="here", local_gpus=3, healthy=False)
    partition = PartitionFactory(
        cluster=cluster, gpu_model=catalog[1], gpus_per_node=3, max_walltime_minutes=60
    )
    assert cluster_sync(cluster=cluster)
    partition.refresh_from_db()
    cluster.refresh_from_db()
    assert (partition.gpus_free, cluster.healthy, cluster.health_checked_at is not None) == (3, True, True)
    listed = client_for(member).get("/api/v1/clusters/").json()["results"]
    assert listed[0]["partitions"][0]["gpus_free"] == 3


def test_an_unusable_cluster_is_marked_unhealthy(catalog, settings, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the state folder should be")
    settings.VAR_DIR = blocked
    cluster = ClusterFactory(slug="here", local_gpus=3, healthy=True)
    assert not cluster_sync(cluster=cluster)
    cluster.refresh_from_db()
    assert not cluster.healthy and cluster.health_detail
