"""Admission after a submission (jobs.services.admission.jobs_admit_soon) on real PostgreSQL and Redis: at
once when the partition is free, else by one admit task per partition; and the pass with no GPU
free, which only gives the new jobs their reasons."""

import base64
import json
import threading
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.db import connection, connections, transaction
from kombu import Connection

from clusters.models import Partition
from jobs.models import Job, JobState
from jobs.services import JobRequest, job_submit
from jobs.services.admission import admit_mark
from jobs.tasks import admit_partition
from portal.celery import app
from tenants.models import Role
from tests.conftest import join
from tests.factories import QuotaGrantFactory

SCRIPT = "#!/bin/bash\ntrue\n"


def request_for(tenant, catalog, partition, **fields) -> JobRequest:
    scenario, gpu_model = catalog
    values = {"gpus": 1, "walltime_minutes": 10, "name": "admit"} | fields
    return JobRequest(tenant=tenant, scenario=scenario, gpu_model=gpu_model, script=SCRIPT,
                      cluster=partition.cluster, partition=partition.name, **values)  # fmt: skip


def sent_tasks() -> list[tuple[str, dict]]:
    """(task name, kwargs) of every message waiting in the broker's default queue."""
    with Connection(app.conf.broker_url) as broker:
        client = broker.default_channel.client
        raw = client.lrange(app.conf.task_default_queue, 0, -1)
    messages = [json.loads(item) for item in raw]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[1]) for m in messages]


@pytest.fixture
def empty_queue():
    with Connection(app.conf.broker_url) as broker:
        broker.default_channel.client.delete(app.conf.task_default_queue)


class PartitionLock:
    """The partition's row lock as admission takes it, held by another connection (as a
    submission or an end admitting there would)."""

    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id
        self.taken, self.release = threading.Event(), threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.taken.wait(10), "the other connection never got the lock"
        return self

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                Partition.objects.select_for_update(no_key=True).get(pk=self.partition_id)
                self.taken.set()
                self.release.wait(30)
        finally:
            connections.close_all()

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_a_submission_admits_at_once_when_the_partition_is_free(member, tenant, catalog, local_partition, grant,
                                                                empty_queue):  # fmt: skip
    job, created = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
    assert created and job.holds_gpus and job.reason == ""
    assert sent_tasks() == [("jobs.tasks.dispatch_job", {"job_id": job.pk})]


@pytest.mark.django_db(transaction=True)
def test_submissions_that_find_the_partition_busy_leave_admission_to_one_admit_task(
    member, tenant, catalog, local_partition, grant, empty_queue
):
    cache.delete(admit_mark(local_partition.pk))
    with PartitionLock(local_partition.pk):
        jobs = [
            job_submit(user=member, request=request_for(tenant, catalog, local_partition))[0]
            for _ in range(3)
        ]
        # stored and reserved, not admitted: nobody waited for the lock
        assert [(job.state, job.holds_gpus, job.reason) for job in jobs] == [(JobState.QUEUED, False, "")] * 3
        grant.refresh_from_db()
        assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (Decimal("0.51"), 0)
        assert sent_tasks() == [("jobs.tasks.admit_partition", {"partition_id": local_partition.pk})]
        assert cache.get(admit_mark(local_partition.pk)) == 1

    assert admit_partition(partition_id=local_partition.pk) == 3
    assert cache.get(admit_mark(local_partition.pk)) is None  # the next busy submission sends again
    assert set(Job.objects.values_list("holds_gpus", "reason")) == {(True, "")}
    assert sorted(kwargs["job_id"] for name, kwargs in sent_tasks() if name == "jobs.tasks.dispatch_job") == [
        job.pk for job in jobs
    ]


@pytest.mark.django_db(transaction=True)
def test_with_no_gpu_free_only_the_new_jobs_get_a_reason(member, tenant, catalog, local_partition, grant,
                                                         other_tenant, empty_queue):  # fmt: skip
    """local_partition has 4 GPUs: a job of 4 takes them; then each new job waits, with
    quota_wait when its own grant is full and capacity_wait otherwise."""
    big, _ = job_submit(user=member, request=request_for(tenant, catalog, local_partition, gpus=4))
    assert big.holds_gpus
    small, _ = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
    assert (small.holds_gpus, small.reason) == (False, "quota_wait")  # the grant allows 4 at once

    QuotaGrantFactory(tenant=other_tenant, pair=catalog)
    other = join(other_tenant, "other-member", Role.MEMBER)
    waiting, _ = job_submit(user=other, request=request_for(other_tenant, catalog, local_partition))
    assert (waiting.holds_gpus, waiting.reason) == (False, "capacity_wait")
    Job.objects.filter(pk=small.pk).update(reason="earlier")  # a reason it has keeps
    job_submit(user=other, request=request_for(other_tenant, catalog, local_partition))
    assert Job.objects.get(pk=small.pk).reason == "earlier"


@pytest.mark.django_db(transaction=True)
def test_a_failed_admission_after_the_commit_still_answers_the_stored_job(
    member, tenant, catalog, local_partition, grant, empty_queue
):
    """The job and its reservation are committed before admission runs: should admission fail
    (here a PostgreSQL trigger refuses the reason's UPDATE), the submission still returns the job,
    not a 500 that a client would retry into a second job, and the admit task takes over."""
    big, _ = job_submit(user=member, request=request_for(tenant, catalog, local_partition, gpus=4))
    assert big.holds_gpus  # the partition's 4 GPUs: the next job takes the no-GPU path
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_reason() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_reason BEFORE UPDATE OF reason ON jobs_job "
            "FOR EACH ROW WHEN (NEW.reason <> OLD.reason) EXECUTE FUNCTION refuse_reason()"
        )
    try:
        job, created = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_reason ON jobs_job")
            cursor.execute("DROP FUNCTION refuse_reason()")
    assert created and Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert ("jobs.tasks.admit_partition", {"partition_id": local_partition.pk}) in sent_tasks()
    assert admit_partition(partition_id=local_partition.pk) == 0
    assert Job.objects.get(pk=job.pk).reason == "quota_wait"  # the grant's 4 GPUs are the big job's
