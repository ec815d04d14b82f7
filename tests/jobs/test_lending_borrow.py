"""Borrowing through the services (jobs/services/lending.py, admission.py) on real PostgreSQL, no
scheduler: which borrowed jobs give their GPUs back, who borrows what its grant lacks, and the
limits on both sides. After every step each grant's ledger is checked against its jobs and loans
(lending_support.ledger_errors); the fixtures (partition, climate, climber, pool) are in
tests/jobs/conftest.py."""

import json
from decimal import Decimal

import pytest

from clusters.models import GpuModel, Scenario
from clusters.shares import Share
from jobs.models import Job, Loan
from jobs.services import job_cancel, jobs_admit
from jobs.services.lending import fewest_that_free, lending_pool
from tenants.models import QuotaGrant
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory
from tests.jobs_support import submit_admitted
from tests.lending_support import (
    audit,
    job_request,
    ledger_errors,
    make_pool,
    refreshed,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("lending_backoff")]


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
