"""Loans, reclaims, restarts and lost work through the services (jobs/services/lending.py,
admission.py, finish.py, attempts.py, cancel.py) on real PostgreSQL, no scheduler: admission
passes run here, an attempt's end is what the scheduler would report (JobStatus), and after
every step each grant's ledger is checked against its jobs and loans (lending_support.
ledger_errors). Times are realistic (attempts of an hour, twenty minutes), so that charges are
fractions to the ledger's 4 places. The end-to-end run on Slurm is test_jobs_slurm_lending.py."""

import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from clusters.backends.base import JobState, JobStatus
from clusters.models import GpuModel, Scenario
from clusters.services import backend_of
from clusters.shares import Share
from jobs.models import Job, JobAttempt, JobEvent, Loan
from jobs.services import attempt_review, job_cancel, job_stop, job_warn, jobs_admit, jobs_dispatch, jobs_poll
from jobs.services.attempts import last_checkpoint
from jobs.services.cancel import jobs_stop_overdue
from jobs.services.finish import job_finish
from jobs.services.lending import fewest_that_free, lending_pool
from tenants.models import QuotaGrant, Role
from tests.conftest import join
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory, TenantFactory
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    audit,
    empty_broker_queue,
    end,
    job_request,
    ledger_errors,
    make_pool,
    run,
    sent_tasks,
)

pytestmark = pytest.mark.django_db

H = timedelta(hours=1)


@pytest.fixture
def partition(catalog, settings, tmp_path):
    """The local cluster "local" (its state under the test's VAR_DIR), 2 nodes of 8 H100."""
    settings.VAR_DIR = tmp_path
    return PartitionFactory(
        cluster=ClusterFactory(slug="local"), gpu_model=catalog[1], nodes=2, max_walltime_minutes=600
    )


@pytest.fixture
def climate(db):
    return TenantFactory(slug="climate")


@pytest.fixture
def climber(climate):
    """A member of climate, the lender."""
    return join(climate, "climber", Role.MEMBER)


@pytest.fixture
def pool(tenant, climate, catalog):
    """pool(**limits): protein-lab borrows from climate (lending_support.make_pool)."""
    return lambda **fields: make_pool(tenant, climate, catalog, **fields)


@pytest.fixture(autouse=True)
def _backoff(settings):
    settings.JOB_RESTART_BACKOFF_S = 30
    settings.JOB_RESTART_BACKOFF_MAX_S = 1800


def whole_seconds_ago(delta: timedelta) -> datetime:
    return (timezone.now() - delta).replace(microsecond=0)


def refreshed(*objects):
    for obj in objects:
        obj.refresh_from_db()
    return objects


# --- Which borrowed jobs give their GPUs back


@pytest.mark.parametrize(
    ("need", "chosen"),
    [
        (1, [30]),  # the youngest of those that free enough alone
        (2, [10]),  # one job of 2 rather than the two youngest of 1
        (3, [30, 10]),  # two, the youngest such pair
        (4, [30, 20, 10]),
        (5, []),  # all of them free 4
    ],
)
def test_fewest_that_free_takes_the_fewest_jobs_then_the_youngest(need, chosen):
    # youngest first: 30 and 20 hold 1 GPU each, 10 holds 2
    assert fewest_that_free([30, 20, 10], {30: 1, 20: 1, 10: 2}, need) == chosen


def test_fewest_that_free_of_no_candidates_is_none():
    assert fewest_that_free([], {}, 1) == []


# --- Borrowing


def test_a_preemptible_job_borrows_what_its_grant_lacks_from_another_member(
    member, tenant, climate, catalog, partition, pool
):
    p = pool()
    job = submit_admitted(member, job_request(tenant, partition, catalog, gpus=2, preemptible=True))
    assert (job.holds_gpus, job.reason, job.gpus_borrowed) == (True, "", 1)
    loan = Loan.objects.get()
    assert (loan.job_id, loan.attempt, loan.borrower_id, loan.lender_id, loan.lender_grant_id) == (
        job.pk, 1, tenant.pk, climate.pk, p.lender_grant.pk,
    )  # fmt: skip
    assert (loan.cohort_id, loan.gpus, loan.ended_at, loan.reclaimed) == (p.cohort.pk, 1, None, False)
    borrower_grant, lender_grant = refreshed(p.borrower_grant, p.lender_grant)
    assert (borrower_grant.gpus_in_use, lender_grant.gpus_in_use) == (1, 1)
    assert borrower_grant.gpu_hours_reserved == Decimal("4.0000") and lender_grant.gpu_hours_reserved == 0
    shared = {"loan": loan.pk, "gpus": 1, "cohort": p.cohort.pk}
    lenders, borrowers = audit(climate, "loan.start"), audit(tenant, "loan.start")
    # the lender's is about its grant; the borrower's job is not its to know of
    assert lenders == [
        {"tenant_slug": "climate", "target": ("tenants.quotagrant", str(p.lender_grant.pk)), "data": shared}
    ]
    assert borrowers == [
        {"tenant_slug": "protein-lab", "target": ("jobs.job", str(job.pk)), "data": shared | {"attempt": 1}}
    ]
    # neither side's record names the other tenant
    assert tenant.slug not in json.dumps(lenders) and climate.slug not in json.dumps(borrowers)
    assert ledger_errors() == []


def test_a_job_that_is_not_preemptible_waits_for_its_own_grant(member, tenant, catalog, partition, pool):
    pool()
    own = submit_admitted(member, job_request(tenant, partition, catalog, name="own"))
    assert own.holds_gpus  # the grant's one GPU
    plain = submit_admitted(member, job_request(tenant, partition, catalog, name="plain"))
    assert (plain.holds_gpus, plain.reason, plain.gpus_borrowed) == (False, "quota_wait", 0)
    borrowing = submit_admitted(member, job_request(tenant, partition, catalog, preemptible=True))
    assert (borrowing.holds_gpus, borrowing.gpus_borrowed) == (True, 1)
    (plain,) = refreshed(plain)
    assert (plain.holds_gpus, plain.reason) == (False, "quota_wait")
    assert list(Loan.objects.values_list("job_id", flat=True)) == [borrowing.pk]
    assert ledger_errors() == []


@pytest.mark.parametrize(
    ("lending_limit", "borrowing_limit", "borrowed"),
    [
        (4, 0, 0),  # the borrower may borrow nothing
        (1, 4, 1),  # the lender lends 1 at most: the second waits though its grant has 3 idle
        (4, 1, 1),  # the borrower borrows 1 at most
    ],
)
def test_nobody_borrows_past_either_limit(
    member, tenant, catalog, partition, pool, lending_limit, borrowing_limit, borrowed
):
    p = pool(lending_limit=lending_limit, borrowing_limit=borrowing_limit)
    submit_admitted(member, job_request(tenant, partition, catalog, name="own"))
    jobs = [
        submit_admitted(member, job_request(tenant, partition, catalog, preemptible=True, name=f"p{n}"))
        for n in range(2)
    ]
    jobs = refreshed(*jobs)
    assert [(j.holds_gpus, j.gpus_borrowed, j.reason) for j in jobs] == [(True, 1, "")] * borrowed + [
        (False, 0, "quota_wait")
    ] * (2 - borrowed)
    assert Loan.objects.count() == borrowed
    (lender_grant,) = refreshed(p.lender_grant)
    assert lender_grant.gpus_in_use == borrowed
    assert ledger_errors() == []


def test_a_share_job_does_not_borrow(member, tenant, climate, catalog, settings, tmp_path):
    """A MIG job of a full MIG grant waits though the cohort lends whole H200s; a whole-GPU job
    of the same tenant, in the same state, borrows one."""
    settings.VAR_DIR = tmp_path
    h200 = Scenario.objects.get(slug="ai-training"), GpuModel.objects.get(slug="h200")
    partition = PartitionFactory(
        cluster=ClusterFactory(slug="local"), name="h200", gpu_model=h200[1], gpus_per_node=8,
        share_kinds=["whole", "mig"], mig_profiles=["3g.71gb"],
    )  # fmt: skip
    p = make_pool(tenant, climate, h200, lending_limit=4)
    QuotaGrantFactory(tenant=tenant, pair=h200, share="mig", mig_profile="3g.71gb", gpus=1)
    mig = Share(kind="mig", mig_profile="3g.71gb")
    assert submit_admitted(member, job_request(tenant, partition, h200, name="own-whole")).holds_gpus
    assert submit_admitted(member, job_request(tenant, partition, h200, name="own-mig", share=mig)).holds_gpus
    whole = submit_admitted(member, job_request(tenant, partition, h200, preemptible=True, name="whole"))
    share = submit_admitted(
        member, job_request(tenant, partition, h200, preemptible=True, name="mig", share=mig)
    )
    assert (whole.holds_gpus, whole.gpus_borrowed) == (True, 1)
    assert (share.holds_gpus, share.gpus_borrowed, share.reason) == (False, 0, "quota_wait")
    assert list(Loan.objects.values_list("job_id", flat=True)) == [whole.pk]
    (lender_grant,) = refreshed(p.lender_grant)
    assert lender_grant.gpus_in_use == 1
    assert ledger_errors() == []


def test_a_lender_whose_own_job_waits_for_quota_lends_nothing_new(
    member, climber, tenant, climate, catalog, partition, pool
):
    pool(lender_gpus=2, lending_limit=2)
    submit_admitted(member, job_request(tenant, partition, catalog, name="own"))
    assert submit_admitted(climber, job_request(climate, partition, catalog, name="small")).holds_gpus
    big = submit_admitted(climber, job_request(climate, partition, catalog, gpus=2, name="big"))
    assert (big.holds_gpus, big.reason) == (False, "quota_wait")  # 1 of its grant's 2 is in use
    borrowing = submit_admitted(member, job_request(tenant, partition, catalog, preemptible=True))
    assert (borrowing.holds_gpus, borrowing.reason) == (False, "quota_wait")  # 1 idle, not lent
    assert not Loan.objects.exists()

    job_cancel(actor=climber, job=big)  # the lender's own job no longer waits
    jobs_admit(partition_id=partition.pk)
    (borrowing,) = refreshed(borrowing)
    assert (borrowing.holds_gpus, borrowing.gpus_borrowed) == (True, 1)
    assert ledger_errors() == []


# --- Reclaims


@pytest.fixture
def lent_out(member, climber, tenant, climate, catalog, partition, pool):
    """climate's grant of 5 GPUs lends 4 to protein-lab's preemptible jobs b1 (2 GPUs), b2 and b3
    (1 each), admitted in that order, all running; then climate's own job l0 (1 GPU) runs on the
    fifth, the youngest of all. protein-lab's own job runs on its grant's one GPU."""
    p = pool(lender_gpus=5, lending_limit=4, borrowing_limit=4, grace_s=120)
    jobs = {"own": submit_admitted(member, job_request(tenant, partition, catalog, name="own"))}
    for name, gpus in (("b1", 2), ("b2", 1), ("b3", 1)):
        request = job_request(
            tenant, partition, catalog, gpus=gpus, preemptible=True, max_restarts=3, name=name
        )
        jobs[name] = submit_admitted(member, request)
        assert (jobs[name].holds_gpus, jobs[name].gpus_borrowed) == (True, gpus)
    jobs["l0"] = submit_admitted(climber, job_request(climate, partition, catalog, name="l0"))
    started = whole_seconds_ago(2 * H)
    for n, job in enumerate(jobs.values()):
        run(job, started_at=started, backend_id=f"local-{n + 1}")
    (lender_grant,) = refreshed(p.lender_grant)
    assert lender_grant.gpus_in_use == 5
    assert ledger_errors() == []
    return p, jobs


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


# --- Lost work: the attempt's log read for checkpoints


def log_of(settings, token: str):
    """Where the local cluster "local" keeps a job's output (clusters/backends/local)."""
    path = settings.VAR_DIR / "local-cluster" / "local" / "jobs" / token / f"{token}.out"
    path.parent.mkdir(parents=True)
    return path


def test_last_checkpoint_is_the_newest_marker_within_the_attempt():
    start = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    stamp = int(start.timestamp())
    lines = [
        f"PORTAL_CHECKPOINT {stamp - 60}",  # before the attempt: an earlier attempt's
        f"  PORTAL_CHECKPOINT {stamp + 600} step=12",
        f"PORTAL_CHECKPOINT {stamp + 1200}",
        f"PORTAL_CHECKPOINT {stamp + 900}",  # older than the one above, printed later
        f"echo PORTAL_CHECKPOINT {stamp + 1500}",  # not at the start of its line
        f"PORTAL_CHECKPOINT {stamp + 1600}x",
        "PORTAL_CHECKPOINT soon",
        f"PORTAL_CHECKPOINT {stamp + 7200}",  # after the attempt's end
    ]
    assert last_checkpoint(lines, started_at=start, ended_at=start + H) == start + timedelta(seconds=1200)
    assert last_checkpoint(lines[:2], started_at=start, ended_at=start + H) == start + timedelta(seconds=600)
    assert last_checkpoint(lines[4:], started_at=start, ended_at=start + H) is None


@pytest.fixture
def restarted(member, tenant, catalog, partition, pool):
    """A 2-GPU job (one borrowed) whose first attempt ran 3613 s from 3 hours ago on local-7 and
    ended NODE_FAIL: 2.0072 GPU-hours charged, 1.9928 kept reserved. (job, its first attempt)."""
    pool()
    request = job_request(tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=2)
    job = run(submit_admitted(member, request), started_at=whole_seconds_ago(3 * H))
    job = end(job, JobState.NODE_FAIL, ran_s=3613)
    assert (job.attempt, job.reserved_gpu_hours) == (2, Decimal("1.9928"))
    return job, JobAttempt.objects.get(job=job, number=1)


def test_attempt_review_gives_back_what_ran_past_the_last_checkpoint_once(settings, restarted):
    job, attempt = restarted
    start = int(attempt.started_at.timestamp())
    log_of(settings, attempt.token).write_text(
        "\n".join(
            [
                "epoch 1",
                f"PORTAL_CHECKPOINT {start - 100}",
                f"PORTAL_CHECKPOINT {start + 600}",
                f"PORTAL_CHECKPOINT {start + 2400} step=7",
                f"PORTAL_CHECKPOINT {start + 3613 + 60}",  # after the end: not this attempt's
                "node failure",
            ]
        )
        + "\n"
    )
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert reviewed.reviewed and reviewed.checkpoint_at == attempt.started_at + timedelta(seconds=2400)
    assert reviewed.minutes_kept == 40
    lost = Decimal("0.6739")  # 2 GPUs × the 1213 s after the checkpoint
    assert reviewed.gpu_hours_lost == lost
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    # not charged: off the grant's used hours, back into the job's reservation for the next attempt
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (
        Decimal("2.0072") - lost,
        Decimal("1.9928") + lost,
    )
    assert (job.gpu_hours, job.reserved_gpu_hours, job.gpu_hours_lost) == (
        Decimal("1.3333"), Decimal("2.6667"), lost,
    )  # fmt: skip
    assert ledger_errors() == []

    again = attempt_review(attempt_id=attempt.pk)
    assert (again.checkpoint_at, again.gpu_hours_lost) == (reviewed.checkpoint_at, lost)
    (job,) = refreshed(job)
    (grant,) = refreshed(grant)
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (Decimal("1.3333"), Decimal("2.6667"))
    assert (job.gpu_hours, job.reserved_gpu_hours, job.gpu_hours_lost) == (
        Decimal("1.3333"), Decimal("2.6667"), lost,
    )  # fmt: skip


@pytest.mark.parametrize("backend_id", ["", "local-7"], ids=["never-submitted", "no-log"])
def test_attempt_review_without_a_checkpoint_loses_the_whole_attempt(settings, restarted, backend_id):
    job, attempt = restarted
    JobAttempt.objects.filter(pk=attempt.pk).update(backend_id=backend_id)
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert (reviewed.reviewed, reviewed.checkpoint_at, reviewed.gpu_hours_lost) == (
        True,
        None,
        Decimal("2.0072"),
    )
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (0, Decimal("4.0000"))
    assert (job.gpu_hours, job.reserved_gpu_hours) == (0, Decimal("4.0000"))
    assert ledger_errors() == []


def test_the_review_of_a_jobs_last_attempt_takes_lost_hours_off_used_only(settings, restarted, partition):
    """Once the job has ended, nothing more runs the lost work again: the reservation stays 0."""
    job, _ = restarted
    Job.objects.filter(pk=job.pk).update(restart_after=None, max_restarts=1)  # its last attempt
    jobs_admit(partition_id=partition.pk)
    job = run(Job.objects.get(pk=job.pk), started_at=whole_seconds_ago(H), backend_id="local-9")
    job = end(job, JobState.NODE_FAIL, ran_s=1801)  # 1.0006
    assert job.state == JobState.NODE_FAIL
    last = JobAttempt.objects.get(job=job, number=2)
    log_of(settings, last.token).write_text(f"PORTAL_CHECKPOINT {int(last.started_at.timestamp()) + 1501}\n")
    assert attempt_review(attempt_id=last.pk).gpu_hours_lost == Decimal("0.1667")  # 2 GPUs × 300 s
    (job,) = refreshed(job)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (Decimal("2.0072") + Decimal("0.8339"), 0)
    # the ended job's reservation (released on the grant at its end) is not raised again
    assert (job.reserved_gpu_hours, job.gpu_hours_lost) == (Decimal("1.9928"), Decimal("0.1667"))
    assert ledger_errors() == []


@pytest.mark.parametrize(
    "state, exit_code", [(JobState.COMPLETED, 0), (JobState.FAILED, 1), (JobState.FAILED, 42)]
)
def test_a_completed_or_failed_attempt_loses_nothing(settings, restarted, partition, state, exit_code):
    """A job's own failure is charged in full, even with an exit code it restarts on: else an
    attempt that ends with a chosen code would run free."""
    job, _ = restarted
    Job.objects.filter(pk=job.pk).update(restart_after=None, restart_exit_codes="42")
    jobs_admit(partition_id=partition.pk)
    job = run(Job.objects.get(pk=job.pk), started_at=whole_seconds_ago(H), backend_id="local-9")
    job = end(job, state, ran_s=1801, exit_code=exit_code)
    last = JobAttempt.objects.get(job=job, number=2)
    log_of(settings, last.token).write_text(f"PORTAL_CHECKPOINT {int(last.started_at.timestamp()) + 60}\n")
    reviewed = attempt_review(attempt_id=last.pk)
    assert (reviewed.reviewed, reviewed.checkpoint_at, reviewed.gpu_hours_lost) == (True, None, 0)
    (grant,) = refreshed(QuotaGrant.objects.get(pk=job.grant_id))
    used = Decimal("3.0078")  # both attempts in full
    # exit code 42 restarts it: the rest of its reservation stays for its third attempt
    reserved = Decimal("0.9922") if exit_code == 42 else 0
    assert (grant.gpu_hours_used, grant.gpu_hours_reserved) == (used, reserved)
    assert ledger_errors() == []


# --- Stopping a reclaimed job


@pytest.fixture
def broker_queue():
    empty_broker_queue()
    yield
    empty_broker_queue()


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


TRAPPING = """#!/bin/bash
trap 'echo "PORTAL_CHECKPOINT $(date +%s)"; exit 0' "$PORTAL_PREEMPT_SIGNAL"
echo "attempt=$PORTAL_ATTEMPT"
sleep 120 &
wait
"""


def wait_for(predicate, *, cluster_id: int, timeout_s: float = 20):
    """Poll the cluster as beat would until predicate() holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the local cluster never got there"
        jobs_poll(cluster_id=cluster_id)
        time.sleep(0.1)


def test_a_reclaimed_job_on_the_local_cluster_is_warned_saves_and_comes_back(
    broker_queue, member, climber, tenant, climate, catalog, partition, pool
):
    """Real processes: a borrowed job running on the local cluster, reclaimed; job_warn sends its
    scheduler the warning (SIGTERM: its trap prints a checkpoint and exits) and the stop for when
    its grace is out; the poll sees it end PREEMPTED, it is queued again, and the review of its
    attempt reads the checkpoint from its real log."""
    pool(lender_gpus=1, lending_limit=1, grace_s=30)
    request = job_request(
        tenant, partition, catalog, gpus=2, preemptible=True, max_restarts=1, script=TRAPPING
    )
    job = submit_admitted(member, request)
    assert job.gpus_borrowed == 1
    try:
        assert jobs_dispatch(job_id=job.pk) == 1
        wait_for(
            lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, cluster_id=partition.cluster_id
        )
        time.sleep(1.2)  # a checkpoint's whole second falls within the attempt
        reclaimer = submit_admitted(climber, job_request(climate, partition, catalog, name="reclaim"))
        assert reclaimer.holds_gpus
        job_warn(job_id=job.pk)
        [(task, kwargs)] = sent_tasks()
        assert (task, kwargs) == ("jobs.tasks.stop_job", {"job_id": job.pk, "attempt": 1})
        wait_for(lambda: Job.objects.get(pk=job.pk).attempt == 2, cluster_id=partition.cluster_id)
    finally:  # no process of ours outlives the test
        backend = backend_of(partition.cluster)
        for backend_id in {
            *JobAttempt.objects.values_list("backend_id", flat=True),
            Job.objects.get(pk=job.pk).backend_id,
        }:
            if backend_id:
                backend.cancel(backend_id)
    (job,) = refreshed(job)
    assert (job.state, job.stop_at, job.holds_gpus) == (JobState.QUEUED, None, False)
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.end_state, attempt.exit_code) == (JobState.PREEMPTED, 0)
    reviewed = attempt_review(attempt_id=attempt.pk)
    assert reviewed.checkpoint_at is not None
    assert attempt.started_at <= reviewed.checkpoint_at <= attempt.ended_at
    assert 0 <= reviewed.gpu_hours_lost < Decimal("0.01")  # it saved as it was warned
    assert ledger_errors() == []
    job_stop(job_id=job.pk)  # the stop sent for the end of its grace, once it has come back: nothing


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


# --- What the review of the change found (races, stale messages, other partitions)


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


def test_the_limits_count_loans_made_after_the_pool_was_read(
    member, tenant, climate, catalog, partition, pool
):
    """Two passes on partitions that one cohort covers both read the loans; the second counts
    them again under the grants' locks, and does not lend past the lender's limit."""
    p = pool(lender_gpus=4, lending_limit=1, borrowing_limit=4)
    waiting = submit_admitted(
        member, job_request(tenant, partition, catalog, gpus=2, preemptible=True, name="second")
    )
    first = Loan.objects.get(job=waiting)  # the one GPU climate may lend
    # Read as the second pass would have, before that loan: now counted again
    Loan.objects.filter(pk=first.pk).update(ended_at=None)
    pool_ = lending_pool(partition, [waiting])
    pool_.count_loans()
    assert (pool_.lent[climate.pk], pool_.borrowed[tenant.pk]) == (1, 1)
    assert pool_.lent_by_grant == {p.lender_grant.pk: 1}
    another = Job(tenant=tenant, grant=p.borrower_grant, gpus=2, preemptible=True, share="whole")
    grants = {g.pk: g for g in QuotaGrant.objects.all()}
    assert pool_.borrow_plan(another, grants[p.borrower_grant.pk], grants) is None


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
