"""GET /api/v1/reports/site/ and its CSV and XLSX: who may read it, usage and cost by tenant,
GPU model, scenario, cluster and partition, utilization per partition and day (allocation and
telemetry), the wait to the first start by scenario and tier, the top consumers."""

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from openpyxl import load_workbook

from billing.models import Price
from billing.pricing import midnight
from jobs.models import Job, JobGpuSample, JobState
from portal.core.staff import ROLE_READ_ONLY_SUPPORT
from portal.core.tokens import token_create
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

DAY = timezone.localdate() - timedelta(days=1)
URL = f"/api/v1/reports/site/?from={DAY}&to={DAY}"


@pytest.fixture
def site(catalog, make_job, member, manager, outsider):
    """On DAY at 2.50 per GPU-hour: member 2 GPUs × 12 h from 06:00 (waited 60 s), manager 1 GPU
    × 4 h from 08:00 (waited 120 s), outsider's job 1 GPU × 2 h from 10:00 (waited 600 s)."""
    Price.objects.create(
        gpu_model=catalog[1], per_gpu_hour=Decimal("2.50"), effective_from=midnight(DAY) - timedelta(days=9)
    )
    jobs = []
    for user, gpus, start_h, hours, wait_s, tier in [
        (member, 2, 6, 12, 60, "normal"),
        (manager, 1, 8, 4, 120, "normal"),
        (outsider, 1, 10, 2, 600, "high"),
    ]:
        start = midnight(DAY) + timedelta(hours=start_h)
        job = make_job(
            user, state=JobState.COMPLETED, gpus=gpus, started_at=start, finished_at=start + timedelta(hours=hours),
            gpu_hours=Decimal(gpus * hours), tier=tier,
        )  # fmt: skip
        Job.objects.filter(pk=job.pk).update(created=start - timedelta(seconds=wait_s))
        jobs.append(job)
    return jobs


def support_user():
    user = UserFactory(username="support", is_staff=True)
    user.groups.add(Group.objects.get(name=ROLE_READ_ONLY_SUPPORT))
    return user


def test_only_staff_who_see_every_tenant_read_it(client_for, site, admin_user, owner, anon_client):
    assert client_for(admin_user).get(URL).status_code == 200
    assert client_for(support_user()).get(URL).status_code == 200
    refused = client_for(owner).get(URL)
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert client_for(owner).get(URL.replace("site/", "site/csv/")).status_code == 403
    assert anon_client.get(URL).status_code == 401
    _, key = token_create(user=admin_user, name="read", scope="read")
    anon_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert anon_client.get(URL).json()["code"] == "token_scope"


def test_usage_and_cost_by_every_group_and_the_top(client_for, site, admin_user, partition_key):
    body = client_for(admin_user).get(URL).json()
    assert (body["from"], body["to"], body["gpu_hours"], body["cost"]) == (str(DAY), str(DAY), 30.0, "75.00")
    assert body["usage"]["tenant"] == [{"key": "protein-lab", "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["usage"]["gpu_model"] == [{"key": "h100-80gb", "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["usage"]["scenario"] == [{"key": "ai-training", "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["usage"]["cluster"] == [{"key": "local", "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["usage"]["partition"] == [{"key": partition_key, "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["usage"]["day"] == [{"key": str(DAY), "gpu_hours": 30.0, "cost": "75.00"}]
    assert body["top"]["users"] == [
        {"key": "member", "gpu_hours": 24.0, "cost": "60.00"},
        {"key": "manager", "gpu_hours": 4.0, "cost": "10.00"},
        {"key": "outsider", "gpu_hours": 2.0, "cost": "5.00"},
    ]
    top_one = client_for(admin_user).get(URL + "&top=1").json()["top"]["users"]
    assert [row["key"] for row in top_one] == ["member"]


@pytest.fixture
def partition_key(site):
    return f"local/{site[0].partition.name}"


def test_utilization_from_the_allocation_and_the_telemetry(client_for, site, admin_user, partition_key):
    for minute, (pct, gpus) in enumerate([(50.0, 2), (80.0, 2), (20.0, 1)]):
        JobGpuSample.objects.create(
            job=site[0], at=midnight(DAY) + timedelta(hours=7, minutes=minute), gpus=gpus, utilization_pct=pct,
            utilization_min_pct=pct, utilization_max_pct=pct,
        )  # fmt: skip
    rows = client_for(admin_user).get(URL).json()["utilization"]
    row = next(r for r in rows if r["partition"] == partition_key)
    # 30 device-GPU-hours held of 8 GPUs × 24 h; readings weighted by the GPUs each read
    assert row == {
        "partition": partition_key, "day": str(DAY), "gpus": 8, "allocated_gpu_hours": 30.0,
        "allocated_pct": 15.62, "telemetry_pct": 56.0,  # 15.625, half to even
    }  # fmt: skip


def test_wait_to_the_first_start_by_scenario_and_tier(client_for, site, admin_user):
    waits = client_for(admin_user).get(URL).json()["waits"]
    # 60, 120, 600 s: the median 120; the 90th percentile 120 + 0.8 × 480; the mean 260
    assert waits["scenario"] == [
        {"key": "ai-training", "jobs": 3, "mean_s": 260.0, "p50_s": 120.0, "p90_s": 504.0}
    ]
    assert waits["tier"] == [
        {"key": "high", "jobs": 1, "mean_s": 600.0, "p50_s": 600.0, "p90_s": 600.0},
        {"key": "normal", "jobs": 2, "mean_s": 90.0, "p50_s": 90.0, "p90_s": 114.0},
    ]


def test_a_restarted_job_waits_until_its_first_attempt_started(
    client_for, admin_user, make_job, member, catalog
):
    start = midnight(DAY) + timedelta(hours=1)
    job = make_job(
        member, state=JobState.COMPLETED, attempt=2, started_at=start + timedelta(hours=2),
        finished_at=start + timedelta(hours=3), gpu_hours=Decimal(2),
    )  # fmt: skip
    job.attempts.create(
        number=1, token="t1", started_at=start, ended_at=start + timedelta(hours=1), end_state=JobState.PREEMPTED,
        gpu_hours=Decimal(1),
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(created=start - timedelta(seconds=30))
    body = client_for(admin_user).get(URL).json()
    assert body["waits"]["scenario"] == [
        {"key": "ai-training", "jobs": 1, "mean_s": 30.0, "p50_s": 30.0, "p90_s": 30.0}
    ]
    assert body["gpu_hours"] == 2.0  # both runs


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("from=2024-13-01", "from"),
        ("to=0001-01-01", "to"),
        ("from=2024-01-01&to=2025-06-01", "from"),
        ("top=0", "top"),
    ],
)
def test_bad_queries_are_400_naming_the_field(client_for, admin_user, query, field):
    response = client_for(admin_user).get(f"/api/v1/reports/site/?{query}")
    assert response.status_code == 400 and field in response.json()["errors"]


def test_csv_and_xlsx_read_back(client_for, site, admin_user, partition_key):
    client = client_for(admin_user)
    response = client.get(f"/api/v1/reports/site/csv/?from={DAY}&to={DAY}&table=usage")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    assert response.content.startswith("\ufeff".encode())
    rows = list(csv.reader(io.StringIO(response.content.decode("utf-8-sig"))))
    assert rows[0][:3] == ["group_by", "key", "gpu_hours"] and rows[0][3].startswith("cost_")
    assert ["tenant", "protein-lab", "30.0000", "75.00"] in rows
    assert ["partition", partition_key, "30.0000", "75.00"] in rows
    waits = client.get(f"/api/v1/reports/site/csv/?from={DAY}&to={DAY}&table=waits").content.decode(
        "utf-8-sig"
    )
    assert "scenario,ai-training,3,260.0,120.0,504.0" in waits
    book = load_workbook(io.BytesIO(client.get(f"/api/v1/reports/site/xlsx/?from={DAY}&to={DAY}").content))
    assert book.sheetnames == ["usage", "utilization", "waits", "top"]
    top = [[cell.value for cell in row] for row in book["top"].iter_rows(min_row=2)]
    assert top[0] == ["tenant", 1, "protein-lab", 30, 75]
    assert top[1] == ["user", 1, "member", 24, 60]
