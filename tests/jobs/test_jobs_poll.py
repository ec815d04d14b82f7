"""jobs_poll against what the scheduler no longer knows of a job: LOST and its quota freed, or, for a
job being cancelled, CANCELLED at once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, JobState
from jobs.services import jobs_poll
from tests.factories import ClusterFactory, PartitionFactory
from tests.jobs_support import api_submit

pytestmark = [pytest.mark.django_db, pytest.mark.grant(gpus=8)]


@pytest.fixture
def partition(catalog, settings, tmp_path):
    """One node of 8 GPUs on the local cluster "local", whose state directory (under VAR_DIR) knows
    no job."""
    settings.VAR_DIR = tmp_path
    return PartitionFactory(cluster=ClusterFactory(slug="local"), gpu_model=catalog[1])


def test_a_job_the_scheduler_forgot_becomes_lost_and_frees_its_quota(client_for, member, partition, grant):
    job_id = api_submit(client_for(member), walltime_minutes=60)["id"]
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=job_id).update(
        state=JobState.PENDING, backend_id="local-999", submitted_at=long_ago
    )
    jobs_poll(cluster_id=partition.cluster_id)
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.reason) == ("LOST", "unknown to the scheduler")
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)


def test_a_cancelled_job_the_scheduler_forgot_is_cancelled_at_once(client_for, member, partition, grant):
    """Kubernetes forgets a Job once its foreground delete is done: no LOST, no grace period."""
    job_id = api_submit(client_for(member), walltime_minutes=60)["id"]
    Job.objects.filter(pk=job_id).update(
        state=JobState.CANCELLING, backend_id="local-999", submitted_at=timezone.now()
    )
    jobs_poll(cluster_id=partition.cluster_id)
    assert Job.objects.get(pk=job_id).state == "CANCELLED"
    grant.refresh_from_db()
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)
