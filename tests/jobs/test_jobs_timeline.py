"""A faithful timeline: a start that no poll saw is still recorded, at the time the scheduler
reports, in order, with started_at set (jobs/services/common.py unseen_start_event)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.backends.base import JobStatus
from jobs.models import Job, JobEvent, JobState
from jobs.services.finish import jobs_finish
from jobs.services.poll import jobs_apply_statuses
from tests.factories import ClusterFactory, PartitionFactory
from tests.jobs_support import api_submit, follow
from tests.wait_support import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.grant(gpus=8)]


@pytest.fixture
def pending(catalog, settings, tmp_path, client_for, member, grant):
    """A job of the member's that the scheduler holds, PENDING in the portal, submitted 10 minutes ago."""
    settings.VAR_DIR = tmp_path
    PartitionFactory(cluster=ClusterFactory(slug="local"), gpu_model=catalog[1])
    job_id = api_submit(client_for(member), walltime_minutes=60)["id"]
    submitted = timezone.now() - timedelta(minutes=10)
    Job.objects.filter(pk=job_id).update(state=JobState.PENDING, backend_id="local-1", submitted_at=submitted)
    JobEvent.objects.filter(job_id=job_id).update(at=submitted - timedelta(seconds=1))  # its QUEUED event
    return Job.objects.get(pk=job_id)


def timeline(job_id: int) -> list[tuple]:
    return list(Job.objects.get(pk=job_id).events.values_list("to_state", "at", "reason"))


def test_a_job_that_started_and_ended_between_two_polls_shows_that_it_ran(pending):
    started = pending.submitted_at + timedelta(minutes=2)
    ended = started + timedelta(seconds=3)
    status = JobStatus(
        "local-1", JobState.COMPLETED, "COMPLETED", exit_code=0, started_at=started, finished_at=ended
    )
    assert jobs_finish({pending.pk: status}) == 1
    events = timeline(pending.pk)
    assert [e[0] for e in events][-2:] == ["RUNNING", "COMPLETED"]
    assert events[-2][1:] == (started, "started") and events[-1][1] == ended
    job = Job.objects.get(pk=pending.pk)
    assert (job.started_at, job.finished_at) == (started, ended)
    assert job.gpu_hours > 0  # 3 s × its GPUs, charged from the reported start


def test_a_job_refused_or_never_started_gets_no_running_event(pending):
    status = JobStatus("local-1", JobState.CANCELLED, "CANCELLED", reason="by admin")
    jobs_finish({pending.pk: status})
    assert "RUNNING" not in [e[0] for e in timeline(pending.pk)]
    assert Job.objects.get(pk=pending.pk).started_at is None


def test_a_start_seen_by_a_poll_is_recorded_at_the_schedulers_time(pending):
    started = pending.submitted_at + timedelta(minutes=4)
    jobs_apply_statuses({pending.pk: JobStatus("local-1", JobState.RUNNING, "RUNNING", started_at=started)})
    assert timeline(pending.pk)[-1][:2] == ("RUNNING", started)


def test_reported_times_stay_in_order_when_the_schedulers_clock_runs_behind(pending):
    """A start before the submission (a clock behind the portal's) is recorded at the submission;
    an end in the future at now."""
    before = pending.submitted_at - timedelta(minutes=5)
    later = timezone.now() + timedelta(hours=1)
    status = JobStatus(
        "local-1", JobState.FAILED, "FAILED", exit_code=1, started_at=before, finished_at=later
    )
    jobs_finish({pending.pk: status})
    events = timeline(pending.pk)
    assert events[-2][:2] == ("RUNNING", pending.submitted_at)
    assert pending.submitted_at <= events[-1][1] <= timezone.now()
    job = Job.objects.get(pk=pending.pk)  # the row says what the events say: no end in the future
    assert (job.started_at, job.finished_at) == (events[-2][1], events[-1][1])
    assert job.gpu_hours < 1  # charged from the submission to now, not an hour ahead


def test_a_short_local_job_shows_running_even_when_no_poll_saw_it(
    celery_worker, client_for, member, local_partition, grant
):
    """The issue's case, as a new user tries it: a 3-second job on the local cluster, and the
    first poll only after it ended."""
    client = client_for(member)
    job = api_submit(client, script="#!/bin/bash\nsleep 3\n")
    wait_until(
        lambda: Job.objects.filter(pk=job["id"], state=JobState.PENDING).exists(),
        timeout_s=30,
        what="submitted",
    )
    time.sleep(6)  # no poll meanwhile: the worker polls only when asked, as beat would ask
    done = follow(client, job["id"], local_partition.cluster_id, {"COMPLETED", "FAILED"})
    events = client.get(f"/api/v1/jobs/{job['id']}/events/").json()
    assert [e["to_state"] for e in events] == ["QUEUED", "SUBMITTING", "PENDING", "RUNNING", "COMPLETED"]
    assert events[3]["at"] == done["started_at"] and events[4]["at"] == done["finished_at"]


def test_a_requeued_jobs_unseen_restart_comes_after_the_requeue(pending):
    """RUNNING (seen), PENDING (requeued), then restarted and ended between two polls: the second
    RUNNING is at the restart the scheduler reports, after the requeue, not at the first start."""
    first = pending.submitted_at + timedelta(minutes=1)
    jobs_apply_statuses({pending.pk: JobStatus("local-1", JobState.RUNNING, "RUNNING", started_at=first)})
    jobs_apply_statuses({pending.pk: JobStatus("local-1", JobState.PENDING, "PENDING", reason="BeginTime")})
    requeued_at = first + timedelta(minutes=2)
    JobEvent.objects.filter(job_id=pending.pk, to_state=JobState.PENDING, from_state=JobState.RUNNING).update(
        at=requeued_at
    )
    restart, ended = first + timedelta(minutes=5), first + timedelta(minutes=6)
    status = JobStatus(
        "local-1", JobState.COMPLETED, "COMPLETED", exit_code=0, started_at=restart, finished_at=ended
    )
    jobs_finish({pending.pk: status})
    events = timeline(pending.pk)
    assert [e[0] for e in events][-4:] == ["RUNNING", "PENDING", "RUNNING", "COMPLETED"]
    assert (events[-3][1], events[-2][1], events[-1][1]) == (requeued_at, restart, ended)
    assert Job.objects.get(pk=pending.pk).started_at == first  # the job's first start is kept
