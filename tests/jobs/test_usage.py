"""GET /api/v1/usage/ with cost: GPU-hours on the days they were used, at the prices then in force,
running jobs so far, and the groups by tenant, scenario and cluster."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Price, TierMultiplier
from billing.pricing import midnight
from jobs.models import JobState
from tenants.models import Role
from tests.conftest import join
from tests.factories import QuotaGrantFactory, TenantFactory

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()
D1, D2 = TODAY - timedelta(days=2), TODAY - timedelta(days=1)


@pytest.fixture
def prices(catalog):
    """2.00 per GPU-hour from long ago, 3.00 from D2's midnight; the high tier pays 1.5 times."""
    Price.objects.create(
        gpu_model=catalog[1], per_gpu_hour=Decimal(2), effective_from=midnight(D1) - timedelta(days=30)
    )
    Price.objects.create(gpu_model=catalog[1], per_gpu_hour=Decimal(3), effective_from=midnight(D2))
    TierMultiplier.objects.create(
        tier="high", multiplier=Decimal("1.5"), effective_from=midnight(D1) - timedelta(days=30)
    )


def ran(make_job, user, *, start, hours, gpus=1, **fields):
    end = start + timedelta(hours=hours)
    return make_job(
        user, state=JobState.COMPLETED, gpus=gpus, started_at=start, finished_at=end,
        gpu_hours=Decimal(hours * gpus), **fields,
    )  # fmt: skip


def test_a_run_over_midnight_lands_on_both_days_at_each_days_price(client_for, member, make_job, prices):
    ran(make_job, member, start=midnight(D2) - timedelta(hours=2), hours=4)
    body = client_for(member).get(f"/api/v1/usage/?from={D1}&to={TODAY}").json()
    assert body["results"] == [
        {"key": str(D1), "gpu_hours": 2.0, "cost": "4.00"},
        {"key": str(D2), "gpu_hours": 2.0, "cost": "6.00"},
    ]
    assert body["currency"]
    # Only D2 asked: its half alone, not the whole job on its finish day.
    only_d2 = client_for(member).get(f"/api/v1/usage/?from={D2}&to={D2}&group_by=user").json()
    assert only_d2["results"] == [{"key": "member", "gpu_hours": 2.0, "cost": "6.00"}]


def test_the_tier_at_submission_multiplies_the_price(client_for, member, make_job, prices):
    ran(make_job, member, start=midnight(D1) + timedelta(hours=10), hours=1, gpus=2, tier="high")
    rows = client_for(member).get(f"/api/v1/usage/?from={D1}&to={D1}").json()["results"]
    assert rows == [{"key": str(D1), "gpu_hours": 2.0, "cost": "6.00"}]  # 2 GPU-hours × 2.00 × 1.5


def test_a_running_job_counts_so_far(client_for, member, make_job, prices):
    make_job(
        member, state=JobState.RUNNING, gpus=2, walltime_minutes=600,
        started_at=timezone.now() - timedelta(minutes=90),
    )  # fmt: skip
    make_job(member, state=JobState.PENDING)  # waiting: nothing used
    rows = client_for(member).get("/api/v1/usage/?group_by=user").json()["results"]
    assert [row["key"] for row in rows] == ["member"]
    assert 3.0 <= rows[0]["gpu_hours"] < 3.01  # 2 GPUs × 1.5 h
    assert Decimal("9.00") <= Decimal(rows[0]["cost"]) <= Decimal("9.03")  # at 3.00


def test_group_by_tenant_scenario_and_cluster_over_the_tenants_one_sees(
    client_for, member, outsider, admin_user, make_job, prices, catalog, tenant
):
    ran(make_job, member, start=midnight(D1) + timedelta(hours=8), hours=1)
    second = TenantFactory(slug="second-lab")
    join(second, "member", Role.MEMBER)
    grant = QuotaGrantFactory(tenant=second, pair=catalog, gpus=8, gpu_hours=100, days=9)
    job = ran(make_job, member, start=midnight(D1) + timedelta(hours=9), hours=3)
    type(job).objects.filter(pk=job.pk).update(tenant=second, grant=grant)
    ran(make_job, outsider, start=midnight(D1) + timedelta(hours=9), hours=5)  # in protein-lab's rows
    url = f"/api/v1/usage/?from={D1}&to={D1}&group_by="

    def keys(user, group):
        return [
            (r["key"], r["gpu_hours"], r["cost"]) for r in client_for(user).get(url + group).json()["results"]
        ]

    assert keys(member, "tenant") == [("protein-lab", 6.0, "12.00"), ("second-lab", 3.0, "6.00")]
    assert keys(admin_user, "tenant") == [("protein-lab", 6.0, "12.00"), ("second-lab", 3.0, "6.00")]
    assert keys(member, "scenario") == [("ai-training", 9.0, "18.00")]
    assert keys(member, "cluster") == [("local", 9.0, "18.00")]
    assert keys(outsider, "tenant") == []  # outsider's job was made in protein-lab, which it cannot see
    assert client_for(member).get(url + "partition").status_code == 400


def test_a_job_whose_submitter_was_deleted_counts_under_no_name(
    client_for, admin_user, member, make_job, prices
):
    ran(make_job, None, start=midnight(D1) + timedelta(hours=1), hours=1)
    ran(make_job, member, start=midnight(D1) + timedelta(hours=3), hours=1)
    rows = client_for(member).get(f"/api/v1/usage/?from={D1}&to={D1}&group_by=user").json()["results"]
    assert rows == [
        {"key": "", "gpu_hours": 1.0, "cost": "2.00"},
        {"key": "member", "gpu_hours": 1.0, "cost": "2.00"},
    ]
    top = client_for(admin_user).get(f"/api/v1/reports/site/?from={D1}&to={D1}").json()["top"]["users"]
    assert top == [
        {"key": "", "gpu_hours": 1.0, "cost": "2.00"},
        {"key": "member", "gpu_hours": 1.0, "cost": "2.00"},
    ]
