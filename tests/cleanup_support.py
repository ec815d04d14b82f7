"""What the cleanup tests share (tests/jobs/test_cleanup_services.py, tests/jobs/test_cleanup_records.py):
a job submitted through the service to their local cluster "cleanup-local", the wait for jobs to
reach a state as beat would poll them, and a grant made to have ended yesterday."""

import time
from datetime import timedelta

from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job
from jobs.services import JobRequest, jobs_poll
from tenants.models import QuotaGrant
from tests.jobs_support import submit_admitted

LONG = "#!/bin/bash\nsleep 300\n"


def submit(user, tenant, catalog, *, gpus: int = 2, script: str = LONG) -> Job:
    scenario, gpu_model = catalog
    request = JobRequest(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=gpus, walltime_minutes=30, name="cleanup",
        script=script, cluster=Cluster.objects.get(slug="cleanup-local"),
    )  # fmt: skip
    return submit_admitted(user, request)


def wait_for(jobs: list[Job], until: set[str], timeout_s: float = 60) -> None:
    """Poll the cluster, as beat would, until every job is in one of `until`."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs_poll(cluster_id=jobs[0].cluster_id)
        states = dict(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", "state"))
        if all(state in until for state in states.values()):
            return
        assert time.monotonic() < deadline, f"jobs still {states}, waiting for {until}"
        time.sleep(0.3)


def end_grant(grant: QuotaGrant) -> None:
    today = timezone.localdate()
    QuotaGrant.objects.filter(pk=grant.pk).update(
        starts_on=today - timedelta(days=10), ends_on=today - timedelta(days=1)
    )
