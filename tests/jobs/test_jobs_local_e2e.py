"""End to end on the local cluster: the API, a real Celery worker on Redis, real processes."""

from decimal import Decimal

from django.utils import timezone

from jobs.models import Job
from tests.jobs_support import api_submit as submit
from tests.jobs_support import follow

TODAY = timezone.localdate()


def test_a_job_runs_to_completion_and_its_gpu_hours_are_charged(
    celery_worker, client_for, member, local_partition, grant
):
    client = client_for(member)
    job = submit(client)
    done = follow(client, job["id"], local_partition.cluster_id, {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED" and done["exit_code"] == 0
    assert done["backend_id"].startswith("local-")
    assert done["gpu_hours"] > 0
    log = client.get(f"/api/v1/jobs/{job['id']}/log/?tail=10").json()
    assert log["lines"][0] in ("gpus=0,1", "gpus=2,3")
    states = [e["to_state"] for e in client.get(f"/api/v1/jobs/{job['id']}/events/").json()]
    assert states[:3] == ["QUEUED", "SUBMITTING", "PENDING"] and states[-1] == "COMPLETED"
    grant.refresh_from_db()
    stored = Job.objects.get(pk=job["id"])
    assert abs(grant.gpu_hours_used - stored.gpu_hours) < Decimal("0.01")  # the ledger keeps 2 decimals
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)


def test_a_failing_script_ends_failed_with_its_exit_code(
    celery_worker, client_for, member, local_partition, grant
):
    client = client_for(member)
    job = submit(client, script="#!/bin/bash\nexit 3\n")
    done = follow(client, job["id"], local_partition.cluster_id, {"COMPLETED", "FAILED"})
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)


def test_cancel_a_running_job(celery_worker, client_for, member, local_partition, grant):
    client = client_for(member)
    job = submit(client, script="#!/bin/bash\nsleep 120\n")
    follow(client, job["id"], local_partition.cluster_id, {"RUNNING"})
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel/").json()["state"] == "CANCELLING"
    done = follow(client, job["id"], local_partition.cluster_id, {"CANCELLED"}, timeout_s=30)
    assert done["finished_at"] is not None
    grant.refresh_from_db()
    assert grant.gpus_in_use == 0
