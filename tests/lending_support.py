"""The lending services' tests (tests/jobs/test_lending_*.py): a cohort of two tenants and
their grants, jobs submitted and admitted through the services, an attempt that ran for a given
time and ended as the scheduler reports, the grants' ledger checked against the jobs and loans,
the tasks waiting in the broker, times in whole seconds and objects read again."""

import base64
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone
from kombu import Connection

from clusters.backends.base import JobStatus
from clusters.models import Partition
from jobs.models import Job, JobEvent, JobState, Loan
from jobs.services import JobRequest
from jobs.services.finish import job_finish
from jobs.states import END_STATES
from portal.celery import app
from portal.core.models import AuditEvent
from tenants.models import Cohort, QuotaGrant, Tenant
from tests.factories import CohortFactory, CohortMemberFactory, QuotaGrantFactory

SCRIPT = "#!/bin/bash\ntrue\n"

H = timedelta(hours=1)


@dataclass
class Pool:
    """A cohort where `borrower` borrows from `lender`, each with a grant of the cohort's model."""

    cohort: Cohort
    borrower: Tenant
    lender: Tenant
    borrower_grant: QuotaGrant
    lender_grant: QuotaGrant


def make_pool(
    borrower: Tenant, lender: Tenant, pair, *, borrower_gpus: int = 1, lender_gpus: int = 4,
    lending_limit: int = 1, borrowing_limit: int = 2, grace_s: int = 120,
) -> Pool:  # fmt: skip
    """Both tenants in a new cohort of the pair's GPU model; the borrower lends nothing, the lender
    borrows nothing. Grants of 100 GPU-hours each."""
    cohort = CohortFactory(gpu_model=pair[1], reclaim_grace_s=grace_s)
    CohortMemberFactory(cohort=cohort, tenant=borrower, lending_limit=0, borrowing_limit=borrowing_limit)
    CohortMemberFactory(cohort=cohort, tenant=lender, lending_limit=lending_limit, borrowing_limit=0)
    return Pool(
        cohort=cohort, borrower=borrower, lender=lender,
        borrower_grant=QuotaGrantFactory(tenant=borrower, pair=pair, gpus=borrower_gpus, gpu_hours=100),
        lender_grant=QuotaGrantFactory(tenant=lender, pair=pair, gpus=lender_gpus, gpu_hours=100),
    )  # fmt: skip


def job_request(tenant: Tenant, partition: Partition, pair, **fields) -> JobRequest:
    """A request of 1 GPU for 2 hours on the partition; `fields` replace those."""
    values = {"gpus": 1, "walltime_minutes": 120, "name": "lend", "script": SCRIPT} | fields
    return JobRequest(
        tenant=tenant, scenario=pair[0], gpu_model=pair[1], cluster=partition.cluster,
        partition=partition.name, **values,
    )  # fmt: skip


def run(job: Job, *, started_at: datetime, backend_id: str = "local-7") -> Job:
    """The admitted job as dispatch and a poll would leave it: in its scheduler under `backend_id`,
    RUNNING since `started_at`. Its earlier events are moved before that start, so that an end
    reported later is kept as reported (finish keeps a reported time after the job's last event)."""
    JobEvent.objects.filter(job=job, at__gte=started_at).update(at=started_at - timedelta(seconds=31))
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, backend_id=backend_id, submitted_at=started_at - timedelta(seconds=30),
        started_at=started_at, reason="",
    )  # fmt: skip
    job.refresh_from_db()
    return job


def end(job: Job, state: str, *, ran_s: int, exit_code: int | None = None) -> Job:
    """The scheduler reports the running job's attempt ended `ran_s` seconds after its start."""
    job.refresh_from_db()
    status = JobStatus(
        backend_id=job.backend_id, state=state, raw_state=state, exit_code=exit_code,
        finished_at=job.started_at + timedelta(seconds=ran_s),
    )  # fmt: skip
    job_finish(job_id=job.pk, status=status)
    job.refresh_from_db()
    return job


def ledger_errors() -> list[str]:
    """Where a grant's ledger disagrees with its jobs and loans: its reservation is the sum of
    what its jobs that have not ended reserve; its GPUs in use, what its jobs that hold GPUs
    hold of their own plus what its open loans lend; its used hours, what its jobs were charged."""
    errors = []
    for grant in QuotaGrant.objects.order_by("pk"):
        jobs = list(Job.objects.filter(grant=grant))
        reserved = sum((j.reserved_gpu_hours for j in jobs if j.state not in END_STATES), Decimal(0))
        own = sum(j.gpus - j.gpus_borrowed for j in jobs if j.holds_gpus)
        lent = Loan.objects.filter(lender_grant=grant, ended_at__isnull=True).aggregate(n=Sum("gpus"))["n"]
        used = sum((j.gpu_hours or Decimal(0) for j in jobs), Decimal(0))
        for name, held, expected in (
            ("gpu_hours_reserved", grant.gpu_hours_reserved, reserved),
            ("gpus_in_use", grant.gpus_in_use, own + (lent or 0)),
            ("gpu_hours_used", grant.gpu_hours_used, used),
        ):
            if held != expected:
                errors.append(
                    f"grant {grant.pk} of {grant.tenant_id}: {name} {held}, its jobs say {expected}"
                )
    return errors


def audit(tenant: Tenant, action: str) -> list[dict]:
    """(tenant_slug, target, data) of the tenant's audit events of that action, oldest first."""
    events = AuditEvent.objects.filter(tenant_id=tenant.pk, action=action).order_by("id")
    return [
        {"tenant_slug": e.tenant_slug, "target": (e.target_type, e.target_id), "data": e.data} for e in events
    ]


def sent_tasks() -> list[tuple[str, dict]]:
    """(task name, kwargs) of every message waiting in the broker's default queue."""
    with Connection(app.conf.broker_url) as broker:
        raw = broker.default_channel.client.lrange(app.conf.task_default_queue, 0, -1)
    messages = [json.loads(item) for item in raw]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[1]) for m in messages]


def empty_broker_queue() -> None:
    with Connection(app.conf.broker_url) as broker:
        broker.default_channel.client.delete(app.conf.task_default_queue)


def whole_seconds_ago(delta: timedelta) -> datetime:
    return (timezone.now() - delta).replace(microsecond=0)


def refreshed(*objects):
    for obj in objects:
        obj.refresh_from_db()
    return objects
