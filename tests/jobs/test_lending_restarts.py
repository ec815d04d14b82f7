"""Ends and restarts of borrowing jobs through the services (jobs/services/finish.py, admission.py,
cancel.py) on real PostgreSQL, no scheduler: which ends bring a job back, its backoff, its attempts
and what each is charged, an earlier attempt's end read late, a cancel during a reclaim's grace. An
attempt's end is what the scheduler would report (JobStatus), and after every step each grant's
ledger is checked against its jobs and loans (lending_support.ledger_errors). Times are realistic
(attempts of an hour, twenty minutes), so that charges are fractions to the ledger's 4 places; the
fixtures (pool, restarted, lent_out) are in tests/jobs/conftest.py."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from clusters.backends.base import JobState, JobStatus
from jobs.models import Job, JobAttempt, JobEvent, Loan
from jobs.services import job_cancel, jobs_admit
from jobs.services.finish import job_finish
from tenants.models import QuotaGrant
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    H,
    end,
    job_request,
    ledger_errors,
    refreshed,
    run,
    whole_seconds_ago,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lending_backoff")]


# --- Ends and restarts


def test_a_job_restarts_borrowing_again_until_it_completes_and_the_ledger_follows(
    member, tenant, catalog, partition, pool, settings
):
    """Three attempts of a 2-GPU job on a 1-GPU grant, each borrowing one GPU: NODE_FAIL, FAILED
    with an exit code to restart on, COMPLETED. Backoffs of 600 s then 900 s (1200 capped)."""
    settings.JOB_RESTART_BACKOFF_S, settings.JOB_RESTART_BACKOFF_MAX_S = 600, 900
    p = pool()
    request = job_request(
        tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=2, restart_exit_codes=(42,)
    )
    job = submit_admitted(member, request)
    assert (job.gpus_borrowed, job.reserved_gpu_hours) == (1, Decimal("4.0000"))
    rounds = [
        (whole_seconds_ago(3 * H), JobState.NODE_FAIL, None, 3613, 600),
        (whole_seconds_ago(timedelta(minutes=50)), JobState.FAILED, 42, 1207, 900),
        (whole_seconds_ago(timedelta(minutes=20)), JobState.COMPLETED, 0, 611, None),
    ]
    for number, (started, state, exit_code, ran_s, backoff) in enumerate(rounds, start=1):
        assert (job.attempt, job.holds_gpus, job.gpus_borrowed) == (number, True, 1)
        assert Loan.objects.get(job=job, ended_at__isnull=True).attempt == number
        job = run(job, started_at=started, backend_id=f"local-{number}")
        assert ledger_errors() == []
        job = end(job, state, ran_s=ran_s, exit_code=exit_code)
        assert not Loan.objects.filter(ended_at__isnull=True).exists()  # closed, the lender's GPU back
        borrower_grant, lender_grant = refreshed(p.borrower_grant, p.lender_grant)
        assert (borrower_grant.gpus_in_use, lender_grant.gpus_in_use) == (0, 0)
        assert ledger_errors() == []
        if backoff is None:
            break
        assert (job.state, job.attempt, job.reason) == (
            JobState.QUEUED, number + 1, f"{state.lower()}: attempt {number + 1} of 3 queued",
        )  # fmt: skip
        now = timezone.now()
        assert now + timedelta(seconds=backoff - 1) < job.restart_after <= now + timedelta(seconds=backoff)
        jobs_admit(partition_id=partition.pk)
        (job,) = refreshed(job)
        assert (job.holds_gpus, job.reason) == (False, "restart_backoff")
        Job.objects.filter(pk=job.pk).update(restart_after=timezone.now() - timedelta(seconds=1))
        jobs_admit(partition_id=partition.pk)
        (job,) = refreshed(job)

    assert (job.state, job.attempt, job.exit_code) == (JobState.COMPLETED, 3, 0)
    charges = [Decimal("2.0072"), Decimal("0.6706"), Decimal("0.3394")]  # 2 GPUs × 3613 s, 1207 s, 611 s
    attempts = list(JobAttempt.objects.filter(job=job).values_list("number", "end_state", "gpu_hours"))
    assert attempts == [
        (1, JobState.NODE_FAIL, charges[0]),
        (2, JobState.FAILED, charges[1]),
        (3, JobState.COMPLETED, charges[2]),
    ]  # fmt: skip
    assert job.gpu_hours == sum(charges) == Decimal("3.0172")
    assert list(Loan.objects.order_by("id").values_list("attempt", "reclaimed")) == [
        (1, False), (2, False), (3, False),
    ]  # fmt: skip
    borrower_grant, lender_grant = refreshed(p.borrower_grant, p.lender_grant)
    assert (borrower_grant.gpu_hours_reserved, borrower_grant.gpus_in_use) == (0, 0)
    assert borrower_grant.gpu_hours_used == Decimal("3.0172")
    assert (lender_grant.gpu_hours_reserved, lender_grant.gpus_in_use, lender_grant.gpu_hours_used) == (
        0,
        0,
        0,
    )
    assert ledger_errors() == []


@pytest.mark.parametrize(
    ("state", "exit_code", "restarts"),
    [
        (JobState.NODE_FAIL, None, True),
        (JobState.PREEMPTED, None, True),
        (JobState.FAILED, 42, True),
        (JobState.FAILED, 1, False),  # not one of its restart_exit_codes
        (JobState.OUT_OF_MEMORY, None, False),
        (JobState.TIMEOUT, None, False),
        (JobState.CANCELLED, None, False),
    ],
)
def test_which_ends_bring_a_job_back(member, tenant, catalog, partition, pool, state, exit_code, restarts):
    p = pool()
    request = job_request(
        tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=1, restart_exit_codes=(42, 75)
    )
    job = run(submit_admitted(member, request), started_at=whole_seconds_ago(H))
    assert job.gpus_borrowed == 1
    job = end(job, state, ran_s=1801, exit_code=exit_code)  # 2 GPUs × 1801 s: 1.0006 GPU-hours
    assert (job.state, job.attempt) == ((JobState.QUEUED, 2) if restarts else (state, 1))
    attempt = JobAttempt.objects.get(job=job)  # one that may restart records even its last attempt
    assert (attempt.number, attempt.end_state, attempt.gpu_hours) == (1, state, Decimal("1.0006"))
    loan = Loan.objects.get(job=job)
    assert (loan.ended_at is not None, loan.reclaimed) == (True, False)
    borrower_grant, lender_grant = refreshed(p.borrower_grant, p.lender_grant)
    assert (borrower_grant.gpus_in_use, lender_grant.gpus_in_use) == (0, 0)
    assert borrower_grant.gpu_hours_used == Decimal("1.0006")
    assert borrower_grant.gpu_hours_reserved == (Decimal("2.9994") if restarts else 0)
    assert ledger_errors() == []


def test_a_job_out_of_restarts_ends(member, tenant, catalog, partition, pool):
    pool()
    request = job_request(tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=1)
    job = run(submit_admitted(member, request), started_at=whole_seconds_ago(2 * H))
    job = end(job, JobState.NODE_FAIL, ran_s=1801)
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
    Job.objects.filter(pk=job.pk).update(restart_after=None)
    jobs_admit(partition_id=partition.pk)
    job = run(Job.objects.get(pk=job.pk), started_at=whole_seconds_ago(H), backend_id="local-8")
    assert job.holds_gpus
    job = end(job, JobState.NODE_FAIL, ran_s=900)  # 2 GPUs × 900 s: 0.5 GPU-hours
    assert (job.state, job.attempt, job.holds_gpus) == (JobState.NODE_FAIL, 2, False)
    assert list(JobAttempt.objects.filter(job=job).values_list("number", "end_state")) == [
        (1, JobState.NODE_FAIL), (2, JobState.NODE_FAIL),
    ]  # fmt: skip
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_reserved, grant.gpus_in_use, grant.gpu_hours_used) == (0, 0, Decimal("1.5006"))
    assert ledger_errors() == []


def test_a_job_someone_cancels_does_not_restart(member, tenant, catalog, partition, pool):
    pool()
    request = job_request(tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=3)
    job = run(submit_admitted(member, request), started_at=whole_seconds_ago(H))
    assert job_cancel(actor=member, job=job).state == JobState.CANCELLING
    # asked 1700 s into its run (the end below comes later, as the scheduler reports it)
    JobEvent.objects.filter(job=job, to_state=JobState.CANCELLING).update(
        at=job.started_at + timedelta(seconds=1700)
    )
    job = end(job, JobState.NODE_FAIL, ran_s=1801)  # its node failed while it was being cancelled
    assert (job.state, job.attempt, job.holds_gpus) == (JobState.NODE_FAIL, 1, False)
    assert (job.restart_after, job.gpu_hours) == (None, Decimal("1.0006"))
    assert not Loan.objects.filter(ended_at__isnull=True).exists()
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_reserved, grant.gpus_in_use) == (0, 0)
    assert ledger_errors() == []


# --- What the review of the change found about ends (stale messages, cancels)


def test_an_earlier_attempts_end_read_late_changes_nothing(restarted):
    """A poll that read attempt 1's end before the job was queued again reports it once more:
    the job (attempt 2, QUEUED) and the ledger stay as they are."""
    job, attempt = restarted
    stale = JobStatus(
        backend_id=attempt.backend_id, state=JobState.NODE_FAIL, raw_state="NODE_FAIL",
        finished_at=attempt.ended_at,
    )  # fmt: skip
    before = Job.objects.values().get(pk=job.pk)
    assert job_finish(job_id=job.pk, status=stale) is False
    assert Job.objects.values().get(pk=job.pk) == before
    assert JobAttempt.objects.filter(job=job).count() == 1
    assert ledger_errors() == []


def test_a_cancel_during_the_grace_ends_the_job_cancelled_not_preempted(
    member, climber, tenant, climate, catalog, partition, lent_out
):
    _p, jobs = lent_out
    submit_admitted(climber, job_request(climate, partition, catalog, gpus=2, name="reclaim"))
    (b1,) = refreshed(jobs["b1"])
    assert b1.stop_at is not None
    b1 = run(b1, started_at=whole_seconds_ago(H), backend_id=b1.backend_id)  # within its walltime
    job_cancel(actor=member, job=b1)
    b1 = end(b1, JobState.CANCELLED, ran_s=3000)  # recorded after the cancel: now
    assert (b1.state, b1.attempt) == (JobState.CANCELLED, 1)  # what its submitter asked: no restart
    assert not JobAttempt.objects.filter(job=b1).exclude(end_state=JobState.CANCELLED).exists()
    assert ledger_errors() == []
