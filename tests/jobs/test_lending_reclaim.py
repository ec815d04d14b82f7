"""Reclaims through the services (jobs/services/lending.py, admission.py, finish.py, cancel.py) on
real PostgreSQL, no scheduler: a lender's waiting job takes back the fewest youngest borrowed jobs,
which are warned, stopped after their grace and queued again; stops that come early or for another
attempt stop nothing. An attempt's end is what the scheduler would report (JobStatus), and after
every step each grant's ledger is checked (lending_support.ledger_errors); the fixtures (lent_out,
broker_queue, pool) are in tests/jobs/conftest.py. The end-to-end run on Slurm is
test_jobs_slurm_lending.py."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from clusters.backends.base import JobState
from clusters.services import backend_of
from jobs.models import Job, JobAttempt, Loan
from jobs.services import job_stop, job_warn, jobs_admit, jobs_dispatch
from jobs.services.cancel import jobs_stop_overdue
from tests.factories import PartitionFactory
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    H,
    audit,
    end,
    job_request,
    ledger_errors,
    refreshed,
    run,
    sent_tasks,
    whole_seconds_ago,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lending_backoff")]


# --- Reclaims


@pytest.mark.parametrize(
    ("gpus", "chosen"),
    [(1, {"b3"}), (2, {"b1"}), (3, {"b1", "b3"})],
    ids=["the-youngest", "fewest-before-youngest", "the-youngest-pair-that-frees-3"],
)
def test_a_lenders_waiting_job_reclaims_the_fewest_youngest_borrowed_jobs(
    climber, tenant, climate, catalog, partition, lent_out, gpus, chosen
):
    p, jobs = lent_out
    before = timezone.now()
    reclaimer = submit_admitted(climber, job_request(climate, partition, catalog, gpus=gpus, name="reclaim"))
    after = timezone.now()
    assert (reclaimer.holds_gpus, reclaimer.reason) == (True, "")  # in the same pass
    refreshed(*jobs.values())
    assert {name for name, job in jobs.items() if job.stop_at is not None} == chosen
    for name in chosen:
        job = jobs[name]
        assert before + timedelta(seconds=120) <= job.stop_at <= after + timedelta(seconds=120)
        assert job.reason.startswith("reclaimed by its lender: stops by ")
        assert "climate" not in job.reason
        assert (job.state, job.holds_gpus) == (JobState.RUNNING, True)  # it runs until it is stopped
    for job in (jobs["own"], jobs["l0"]):
        assert (job.stop_at, job.reason, job.state) == (None, "", JobState.RUNNING)
    loans = {loan.job_id: loan for loan in Loan.objects.all()}
    for name in ("b1", "b2", "b3"):
        loan = loans[jobs[name].pk]
        assert (loan.ended_at is not None, loan.reclaimed) == ((name in chosen,) * 2)
    # 5 in use before; the reclaimed loans came back to the grant, and the reclaimer took its GPUs
    freed = sum(jobs[name].gpus for name in chosen)
    (lender_grant,) = refreshed(p.lender_grant)
    assert lender_grant.gpus_in_use == 5 - freed + gpus

    loan_of = {loan.job_id: loan.pk for loan in Loan.objects.filter(reclaimed=True)}

    def reclaim_records(tenant_, target, extra):
        return sorted(
            (r["tenant_slug"], r["target"], json.dumps(r["data"], sort_keys=True))
            for r in audit(tenant_, "loan.reclaim")
        ) == sorted(
            (
                tenant_.slug,
                target(jobs[name]),
                json.dumps({"loan": loan_of[jobs[name].pk], "gpus": jobs[name].gpus, "cohort": p.cohort.pk,
                            "grace_s": 120} | extra, sort_keys=True),
            )
            for name in chosen
        )  # fmt: skip

    lender_target = ("tenants.quotagrant", str(p.lender_grant.pk))
    assert reclaim_records(climate, lambda job: lender_target, {"for_job": reclaimer.pk})
    assert reclaim_records(tenant, lambda job: ("jobs.job", str(job.pk)), {"attempt": 1})
    assert tenant.slug not in json.dumps(audit(climate, "loan.reclaim"))
    assert climate.slug not in json.dumps(audit(tenant, "loan.reclaim"))
    assert ledger_errors() == []


def test_a_reclaimed_job_that_ends_failed_is_preempted_and_queued_again(
    climber, tenant, climate, catalog, partition, lent_out
):
    p, jobs = lent_out
    submit_admitted(climber, job_request(climate, partition, catalog, gpus=2, name="reclaim"))
    b1 = jobs["b1"]
    (b1,) = refreshed(b1)
    assert b1.stop_at is not None
    started, token, stop_at = b1.started_at, b1.token, b1.stop_at
    # the script's trap saves and exits 143 (Slurm reports FAILED): recorded PREEMPTED
    b1 = end(b1, JobState.FAILED, ran_s=3613, exit_code=143)
    assert (b1.state, b1.attempt, b1.reason) == (JobState.QUEUED, 2, "preempted: attempt 2 of 4 queued")
    assert (b1.stop_at, b1.holds_gpus, b1.gpus_borrowed, b1.backend_id) == (None, False, 0, "")
    assert b1.token != token and b1.started_at is None
    # its backoff, 30 s, or its grace's end if later: its pods may save until then (Kubernetes)
    assert b1.restart_after == stop_at > timezone.now() + timedelta(seconds=30)
    # 2 GPUs for 3613 s: 2.0072 GPU-hours charged, the rest of 4 kept for the next attempt
    assert (b1.gpu_hours, b1.reserved_gpu_hours) == (Decimal("2.0072"), Decimal("1.9928"))
    attempt = JobAttempt.objects.get(job=b1)
    assert (attempt.number, attempt.end_state, attempt.reason, attempt.exit_code) == (
        1, JobState.PREEMPTED, "reclaimed by its lender", 143,
    )  # fmt: skip
    assert (attempt.backend_id, attempt.token, attempt.gpu_hours) == ("local-2", token, Decimal("2.0072"))
    assert (attempt.started_at, attempt.ended_at) == (started, started + timedelta(seconds=3613))
    borrower_grant, lender_grant = refreshed(p.borrower_grant, p.lender_grant)
    assert borrower_grant.gpu_hours_used == Decimal("2.0072")
    assert (borrower_grant.gpus_in_use, lender_grant.gpus_in_use) == (
        1,
        5,
    )  # loans were closed at the reclaim
    assert ledger_errors() == []

    jobs_admit(partition_id=partition.pk)
    (b1,) = refreshed(b1)
    assert (b1.holds_gpus, b1.reason) == (False, "restart_backoff")
    assert Loan.objects.filter(job=b1, ended_at__isnull=True).count() == 0


# --- Stopping a reclaimed job


def test_the_sweep_stops_warned_jobs_a_minute_past_their_stop(broker_queue, make_job, member):
    now = timezone.now()
    overdue = make_job(
        member, state=JobState.RUNNING, backend_id="local-1", stop_at=now - timedelta(seconds=90)
    )
    cancelling = make_job(
        member, state=JobState.CANCELLING, backend_id="local-2", stop_at=now - timedelta(seconds=600)
    )
    make_job(
        member, state=JobState.RUNNING, backend_id="local-3", stop_at=now - timedelta(seconds=30)
    )  # in its minute
    make_job(member, state=JobState.RUNNING, backend_id="local-4")  # never warned
    make_job(member, state=JobState.SUBMITTING, stop_at=now - timedelta(seconds=600))  # no id yet
    make_job(member, state=JobState.PREEMPTED, backend_id="local-5", stop_at=now - timedelta(seconds=600))
    assert jobs_stop_overdue() == 2
    assert sorted(sent_tasks(), key=lambda task: task[1]["job_id"]) == [
        ("jobs.tasks.stop_job", {"job_id": overdue.pk, "attempt": 1}),
        ("jobs.tasks.stop_job", {"job_id": cancelling.pk, "attempt": 1}),
    ]  # fmt: skip


def test_warning_and_stopping_a_job_that_has_ended_or_was_never_warned_does_nothing(
    broker_queue, make_job, member
):
    never = make_job(member, state=JobState.RUNNING, backend_id="local-1")
    ended = make_job(member, state=JobState.PREEMPTED, backend_id="local-2", stop_at=timezone.now())
    for job in (never, ended):
        job_warn(job_id=job.pk)
        job_stop(job_id=job.pk)
    assert sent_tasks() == []


def test_a_reclaimed_job_not_yet_submitted_is_never_submitted(
    member, climber, tenant, climate, catalog, partition, pool
):
    """Admitted, its dispatch not yet run (a stalled cluster holds admitted jobs QUEUED), when its
    lender reclaims: it has nothing to save, so it is not warned; it gives its own GPUs back too
    and waits in line again, and dispatch does not submit it."""
    pool(lender_gpus=1, lending_limit=1)
    job = submit_admitted(member, job_request(tenant, partition, catalog, gpus=2, preemptible=True))
    assert (job.state, job.holds_gpus, job.gpus_borrowed) == (JobState.QUEUED, True, 1)
    assert submit_admitted(climber, job_request(climate, partition, catalog, name="reclaim")).holds_gpus
    (job,) = refreshed(job)
    assert not Loan.objects.filter(ended_at__isnull=True, job=job).exists()
    assert (job.stop_at, job.holds_gpus, job.gpus_borrowed, job.reason) == (None, False, 0, "quota_wait")
    job_warn(job_id=job.pk)  # the warn task the reclaim sent
    try:
        jobs_dispatch(job_id=job.pk)  # the dispatch task admission sent
    finally:
        if backend_id := Job.objects.get(pk=job.pk).backend_id:
            backend_of(partition.cluster).cancel(backend_id)
    (job,) = refreshed(job)
    assert (job.state, job.backend_id) == (JobState.QUEUED, "")
    assert ledger_errors() == []


# --- What the review of the change found about reclaims (early stops, other partitions)


def test_a_stop_for_an_earlier_attempt_or_before_the_grace_is_out_stops_nothing(
    member, climber, tenant, climate, catalog, partition, lent_out
):
    _p, jobs = lent_out
    submit_admitted(climber, job_request(climate, partition, catalog, gpus=1, name="reclaim"))
    (b3,) = refreshed(jobs["b3"])
    assert b3.stop_at is not None and b3.stop_at > timezone.now()
    job_stop(job_id=b3.pk)  # delivered early (a redelivery): its grace is not out
    job_stop(job_id=b3.pk, attempt=b3.attempt + 1)  # another attempt's message
    (b3,) = refreshed(b3)
    assert b3.state == JobState.RUNNING  # no cancel was asked: the local cluster knows no local-4


def test_a_lender_reclaims_what_it_lent_on_another_partition(
    member, climber, tenant, climate, catalog, partition, pool
):
    """A cohort of one partition lends from a grant of the whole GPU model; the lender's job on
    another partition of that model takes back its GPUs all the same."""
    p = pool(lender_gpus=2, lending_limit=2, borrowing_limit=2)
    other = PartitionFactory(cluster=partition.cluster, name="other", gpu_model=catalog[1])
    p.cohort.partition = partition
    p.cohort.save(update_fields=["partition"])
    borrowed = submit_admitted(
        member, job_request(tenant, partition, catalog, gpus=3, preemptible=True, name="borrowed")
    )
    assert borrowed.gpus_borrowed == 2
    run(borrowed, started_at=whole_seconds_ago(H))
    own = submit_admitted(climber, job_request(climate, other, catalog, gpus=1, name="own"))
    assert (own.holds_gpus, own.reason) == (True, "")
    (borrowed,) = refreshed(borrowed)
    assert borrowed.stop_at is not None
    assert Loan.objects.get(job=borrowed).reclaimed
    assert ledger_errors() == []
