"""Budgets (jobs/budgets.py): spent in a month (runs cut at the month's bounds) and over a
grant's life, reserved by waiting and running jobs; a hard budget's 409 budget_exhausted with its
figures, in the submission and its preview; the 50/80/100 % notices, once each, by mail and audit."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Budget, BudgetNotice
from billing.pricing import midnight, month_start
from clusters.backends.base import JobState
from jobs.budgets import BudgetExhausted, budget_status, budgets_notify
from jobs.models import Job
from jobs.services import job_preview
from portal.core.models import AuditEvent
from tests.budgets_support import job_body, job_request, priced
from tests.factories import ClusterFactory, JobFactory, PartitionFactory, QuotaGrantFactory

pytestmark = [pytest.mark.django_db, pytest.mark.grant(gpus=8)]


@pytest.fixture
def partition(catalog):
    return PartitionFactory(cluster=ClusterFactory(slug="local"), gpu_model=catalog[1])


@pytest.fixture
def price(catalog):
    return priced(catalog[1])


def test_a_month_counts_what_was_charged_in_it_and_what_jobs_hold(tenant, other_tenant, member, catalog,
                                                                  make_job, price):  # fmt: skip
    now = midnight(month_start(timezone.localdate()) + timedelta(days=5)) + timedelta(hours=12)
    m0 = midnight(month_start(timezone.localdate(now)))
    # 3 GPU-hours on 1 GPU from an hour before the month: 1 of them last month, 2 in this one.
    make_job(member, state=JobState.COMPLETED, started_at=m0 - timedelta(hours=1), gpu_hours=Decimal(3),
             finished_at=m0 + timedelta(hours=2))  # fmt: skip
    # Running on 2 GPUs for an hour of its 4 GPU-hours: 2 used, 2 still reserved.
    make_job(member, state=JobState.RUNNING, gpus=2, started_at=now - timedelta(hours=1),
             reserved_gpu_hours=Decimal(4))  # fmt: skip
    make_job(member, state=JobState.QUEUED, reserved_gpu_hours=Decimal("1.5"))
    # All of it last month; and a job of another tenant.
    make_job(member, state=JobState.COMPLETED, started_at=m0 - timedelta(days=10), gpu_hours=Decimal(5),
             finished_at=m0 - timedelta(days=9))  # fmt: skip
    JobFactory(grant=QuotaGrantFactory(tenant=other_tenant, pair=catalog), state=JobState.QUEUED)

    month = Budget.objects.create(tenant=tenant, period="month", amount=Decimal(1000))
    status = budget_status(budget=month, now=now)
    assert (status.spent, status.reserved) == (Decimal(20 + 20), Decimal(20 + 15))
    assert (status.left, status.percent, status.period_start) == (Decimal(925), Decimal("7.5"), m0.date())

    # Over the grant's life: every hour its jobs used, last month's too.
    grant = Job.objects.filter(tenant=tenant).first().grant
    per_grant = Budget.objects.create(tenant=tenant, period="grant", grant=grant, amount=Decimal(200))
    status = budget_status(budget=per_grant, now=now)
    assert (status.spent, status.reserved, status.period_start) == (Decimal(30 + 20 + 50), Decimal(35),
                                                                    grant.starts_on)  # fmt: skip


def test_a_hard_budget_answers_409_with_the_figures(client_for, member, tenant, partition, grant, price):
    Budget.objects.create(tenant=tenant, period="month", amount=Decimal(25), hard=True)
    client = client_for(member)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201  # 20.00 of 25
    refused = client.post("/api/v1/jobs/", job_body(), format="json")
    assert refused.status_code == 409 and refused["Content-Type"] == "application/problem+json"
    problem = refused.json()
    assert problem["type"] == "urn:gpu-portal:problem:budget_exhausted"
    assert {k: problem[k] for k in ("code", "amount", "spent", "reserved", "job_cost", "currency", "period")} == {
        "code": "budget_exhausted", "amount": "25.00", "spent": "0.00", "reserved": "20.00",
        "job_cost": "20.00", "currency": "CNY", "period": "month",
    }  # fmt: skip
    assert Job.objects.count() == 1
    grant.refresh_from_db()
    assert grant.gpu_hours_reserved == Decimal(2)  # the refused job's reservation rolled back
    # A smaller job still fits; a soft budget refuses nothing.
    assert client.post("/api/v1/jobs/", job_body(walltime_minutes=15), format="json").status_code == 201
    Budget.objects.update(hard=False)
    assert client.post("/api/v1/jobs/", job_body(), format="json").status_code == 201


def test_a_grants_hard_budget_refuses_and_the_preview_says_so(tenant, member, catalog, partition, grant,
                                                             price):  # fmt: skip
    Budget.objects.create(tenant=tenant, period="grant", grant=grant, amount=Decimal(15), hard=True)
    request = job_request(tenant, *catalog, partition)
    with pytest.raises(BudgetExhausted) as refused:
        job_preview(request=request)
    assert (refused.value.extra["job_cost"], refused.value.extra["period"]) == ("20.00", "grant")
    assert job_preview(request=job_request(tenant, *catalog, partition, walltime_minutes=30)).gpu_hours == 1


def test_each_threshold_is_told_once_by_mail_and_audit(tenant, owner, manager, member, make_job, price,
                                                      mailoutbox, django_capture_on_commit_callbacks):  # fmt: skip
    budget = Budget.objects.create(tenant=tenant, period="month", amount=Decimal(100))
    make_job(member, reserved_gpu_hours=Decimal(4))  # 40 %
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets_notify() == 0
    make_job(member, reserved_gpu_hours=Decimal(1))  # 50 %
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets_notify() == 1
        assert budgets_notify() == 0  # told already
    (mail,) = mailoutbox
    assert sorted(mail.to) == ["manager@example.org", "owner@example.org"]
    assert "50 %" in mail.subject and "protein-lab" in mail.subject
    assert "CN¥100.00" in mail.body and "CN¥50.00" in mail.body and "/t/protein-lab/budget/" in mail.body
    (event,) = AuditEvent.objects.filter(action="budget.threshold")
    start = month_start(timezone.localdate()).isoformat()
    assert (event.tenant_id, event.target_id) == (tenant.pk, str(budget.pk))
    assert event.data == {"threshold": 50, "period": "month", "grant": None, "amount": "100.00",
                          "spent": "50.00", "currency": "CNY", "period_start": start}  # fmt: skip

    make_job(member, reserved_gpu_hours=Decimal(6))  # 110 %: 80 and 100 at once
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets_notify(tenant_id=tenant.pk) == 1
    assert sorted(BudgetNotice.objects.values_list("threshold", flat=True)) == [50, 80, 100]
    assert len(mailoutbox) == 2 and "100 %" in mailoutbox[1].subject
    assert list(AuditEvent.objects.filter(action="budget.threshold").values_list("data__threshold", flat=True)
                .order_by("id")) == [50, 100]  # fmt: skip


def test_a_submission_asks_for_its_tenants_notices(client_for, member, tenant, partition, grant, price,
                                                   django_capture_on_commit_callbacks):  # fmt: skip
    """The check_budgets task it sends after commit runs what it is handed: here, by hand."""
    client = client_for(member)
    with django_capture_on_commit_callbacks(execute=False) as unbudgeted:
        assert client.post("/api/v1/jobs/", job_body(walltime_minutes=15), format="json").status_code == 201
    Budget.objects.create(tenant=tenant, period="month", amount=Decimal(30))
    with django_capture_on_commit_callbacks(execute=False) as budgeted:
        assert client.post("/api/v1/jobs/", job_body(walltime_minutes=45), format="json").status_code == 201
    assert len(budgeted) == len(unbudgeted) + 1  # the budgets' look, besides the admit task
    assert budgets_notify(tenant_id=tenant.pk) == 1  # 20 of 30: past 50 %
    assert list(BudgetNotice.objects.values_list("threshold", flat=True)) == [50]
