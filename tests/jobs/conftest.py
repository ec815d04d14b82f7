"""Fixtures of the jobs tests: the cleanup tests' own local cluster, and one that cannot be reached
(tests/jobs/test_cleanup_services.py, tests/jobs/test_cleanup_records.py)."""

from pathlib import Path

import pytest
from django.conf import settings as django_settings

from clusters.services import backend_of
from jobs.models import Job
from tests.factories import ClusterFactory, PartitionFactory


@pytest.fixture
def cleanup_cluster(catalog):
    """A local cluster "cleanup-local" of 4 real GPUs whose partition declares 8, so that the portal
    admits two 4-GPU jobs and the second waits in the local scheduler's own queue (PENDING)."""
    cluster = ClusterFactory(slug="cleanup-local", name="Cleanup", local_gpus=4)
    PartitionFactory(
        cluster=cluster,
        gpu_model=catalog[1],
        max_walltime_minutes=60,
        max_cpus_per_gpu=1,
        max_mem_per_gpu_mb=1000,
    )
    yield cluster
    backend = backend_of(cluster)
    for backend_id in (
        Job.objects.filter(cluster=cluster).exclude(backend_id="").values_list("backend_id", flat=True)
    ):
        backend.cancel(backend_id)  # no process of ours outlives the test


@pytest.fixture
def broken_cluster(db, tmp_path):
    """An enabled local cluster whose state directory is a file: every call raises BackendUnavailable."""
    path = Path(django_settings.VAR_DIR) / "local-cluster" / "cleanup-broken"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")
    yield ClusterFactory(slug="cleanup-broken", name="Broken", local_gpus=1)
    path.unlink()
