"""Admission after a submission (jobs.services.admission.jobs_admit_later) on real PostgreSQL and
Redis: never in the submission's request, always by the admit task, one per partition for a burst
of submissions; the pass with no GPU free, which only gives the new jobs their reasons; and a lost
admit task, which the sweep makes good."""

import base64
import json
import threading
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.db import connections, transaction
from kombu import Connection

from clusters.models import Partition
from jobs.models import Job, JobState
from jobs.services import JobRequest, job_submit, jobs_sweep
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
def test_a_submission_leaves_admission_to_the_admit_task(member, tenant, catalog, local_partition, grant,
                                                         empty_queue):  # fmt: skip
    cache.delete(admit_mark(local_partition.pk))
    job, created = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
    assert created and (job.holds_gpus, job.reason) == (False, "")
    assert sent_tasks() == [("jobs.tasks.admit_partition", {"partition_id": local_partition.pk})]
    assert admit_partition(partition_id=local_partition.pk) == 1
    assert Job.objects.get(pk=job.pk).holds_gpus
    assert ("jobs.tasks.dispatch_job", {"job_id": job.pk}) in sent_tasks()


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_submissions_shares_one_admit_task_and_never_waits_for_the_partition(
    member, tenant, catalog, local_partition, grant, empty_queue
):
    cache.delete(admit_mark(local_partition.pk))
    with PartitionLock(local_partition.pk):  # an admission pass or an end holds the partition
        jobs = [
            job_submit(user=member, request=request_for(tenant, catalog, local_partition))[0]
            for _ in range(3)
        ]
        # stored and reserved, not admitted, and none of them waited for the lock
        assert [(job.state, job.holds_gpus, job.reason) for job in jobs] == [(JobState.QUEUED, False, "")] * 3
        grant.refresh_from_db()
        assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (Decimal("0.51"), 0)
        assert sent_tasks() == [("jobs.tasks.admit_partition", {"partition_id": local_partition.pk})]
        assert cache.get(admit_mark(local_partition.pk)) == 1

    assert admit_partition(partition_id=local_partition.pk) == 3
    assert cache.get(admit_mark(local_partition.pk)) is None  # the next submission sends again
    assert set(Job.objects.values_list("holds_gpus", "reason")) == {(True, "")}
    assert sorted(kwargs["job_id"] for name, kwargs in sent_tasks() if name == "jobs.tasks.dispatch_job") == [
        job.pk for job in jobs
    ]


def submitted(user, request: JobRequest) -> Job:
    """A submission and then the admit task's pass: the job as the pass left it."""
    job, _ = job_submit(user=user, request=request)
    admit_partition(partition_id=job.partition_id)
    return Job.objects.get(pk=job.pk)


@pytest.mark.django_db(transaction=True)
def test_with_no_gpu_free_only_the_new_jobs_get_a_reason(member, tenant, catalog, local_partition, grant,
                                                         other_tenant, empty_queue):  # fmt: skip
    """local_partition has 4 GPUs: a job of 4 takes them; then each new job waits, with
    quota_wait when its own grant is full and capacity_wait otherwise."""
    big = submitted(member, request_for(tenant, catalog, local_partition, gpus=4))
    assert big.holds_gpus
    small = submitted(member, request_for(tenant, catalog, local_partition))
    assert (small.holds_gpus, small.reason) == (False, "quota_wait")  # the grant allows 4 at once

    QuotaGrantFactory(tenant=other_tenant, pair=catalog)
    other = join(other_tenant, "other-member", Role.MEMBER)
    waiting = submitted(other, request_for(other_tenant, catalog, local_partition))
    assert (waiting.holds_gpus, waiting.reason) == (False, "capacity_wait")
    Job.objects.filter(pk=small.pk).update(reason="earlier")  # a reason it has keeps
    submitted(other, request_for(other_tenant, catalog, local_partition))
    assert Job.objects.get(pk=small.pk).reason == "earlier"


@pytest.mark.django_db(transaction=True)
def test_a_lost_admit_task_is_made_good_by_the_sweep(
    member, tenant, catalog, local_partition, grant, empty_queue, settings, tmp_path
):
    """The job and its reservation are committed before the admit task is sent: should the
    message be lost (a broker flushed, a worker killed), the job waits QUEUED and the dispatch
    sweep's admission gives it its GPUs."""
    settings.VAR_DIR = tmp_path
    job, created = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
    with Connection(app.conf.broker_url) as broker:
        broker.default_channel.client.delete(app.conf.task_default_queue)  # the message, lost
    assert created and not Job.objects.get(pk=job.pk).holds_gpus
    jobs_sweep()
    assert Job.objects.get(pk=job.pk).holds_gpus
    assert ("jobs.tasks.dispatch_job", {"job_id": job.pk}) in sent_tasks()


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_admit_task_waits_for_its_commit(
    member, tenant, catalog, local_partition, grant, empty_queue
):
    """The mark and the message come after the commit: a task that cleared the mark before the
    job was committed would not see it, and the mark would keep the next submissions from
    sending another."""
    cache.delete(admit_mark(local_partition.pk))
    with transaction.atomic():
        job, _ = job_submit(user=member, request=request_for(tenant, catalog, local_partition))
        assert cache.get(admit_mark(local_partition.pk)) is None and sent_tasks() == []
    assert cache.get(admit_mark(local_partition.pk)) == 1
    assert sent_tasks() == [("jobs.tasks.admit_partition", {"partition_id": local_partition.pk})]
    assert admit_partition(partition_id=local_partition.pk) == 1
    assert Job.objects.get(pk=job.pk).holds_gpus
