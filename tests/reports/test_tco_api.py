"""The TCO API (/api/v1/tco/): platform admins only, figures at the measured utilization (charged
GPU-hours of the last 365 days) or a what-if one, bad input named by field, every change audited;
and `manage.py tco_example`."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.backends.base import JobState
from portal.core.models import AuditEvent
from reports.models import TcoProfile
from reports.tco_profiles import delivered_gpu_hours
from tests.api_support import assert_problem
from tests.factories import ClusterFactory, JobFactory, PartitionFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tco/"


def body(**overrides) -> dict:
    """One node of one GPU (8,760 GPU-hours a year) costing 8,760 a year: 1 per GPU-hour at 100 %."""
    return {
        "name": "local",
        "cluster": "local",
        "gpu_model": "h100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
        "node_price": "8760.00",
        "depreciation_years": 2,
        "power_w_per_gpu": 1000,
        "electricity_per_kwh": "0.0000",
        "pue": 1.5,
        "staff_per_year": "4380.00",
        "space_per_year": "0.00",
        "cloud_prices": [{"provider": "cloud-a", "per_gpu_hour": "2.5000"}],
    } | overrides


@pytest.fixture
def jobs(make_job, owner):  # -> the moment the jobs are placed around (the year ends at it)
    """GPU-hours on the local cluster: 876 (36.5 days of 1 GPU) ended 13.5 days ago, 120 of a run
    that began 370 days ago (240 over 10 days, half of it inside the year), 4 so far of a running
    job (its reserve), and none of a job that ended 380 days ago. 100 more on another cluster."""
    now = timezone.now()  # per test, not per module: the suite runs half an hour
    first = make_job(
        owner,
        state=JobState.COMPLETED,
        started_at=now - timedelta(days=50),
        finished_at=now - timedelta(days=13, hours=12),
        gpu_hours=Decimal(876),
    )
    make_job(
        owner,
        state=JobState.COMPLETED,
        started_at=now - timedelta(days=370),
        finished_at=now - timedelta(days=360),
        gpu_hours=Decimal(240),
    )
    make_job(
        owner,
        state=JobState.COMPLETED,
        started_at=now - timedelta(days=400),
        finished_at=now - timedelta(days=380),
        gpu_hours=Decimal(480),
    )
    make_job(
        owner,
        state=JobState.RUNNING,
        gpus=2,
        started_at=now - timedelta(hours=3),
        reserved_gpu_hours=Decimal(4),
    )
    elsewhere = PartitionFactory(cluster=ClusterFactory(slug="elsewhere"))
    JobFactory(
        grant=first.grant,
        submitted_by=owner,
        partition=elsewhere,
        state=JobState.FAILED,
        started_at=now - timedelta(days=6),
        finished_at=now - timedelta(days=6) + timedelta(hours=100),
        gpu_hours=Decimal(100),
    )
    return now


def test_delivered_gpu_hours_count_the_year_on_the_profiles_cluster_or_the_whole_site(
    client_for, admin_user, jobs
):
    api = client_for(admin_user)
    local = api.post(URL, body(), format="json").json()
    site = api.post(URL, body(name="site", cluster=None), format="json").json()
    profiles = list(TcoProfile.objects.order_by("id"))
    delivered = delivered_gpu_hours(profiles=profiles, now=jobs)
    assert delivered == {int(local["id"]): Decimal(1000), int(site["id"]): Decimal(1100)}


def test_the_figures_at_the_measured_utilization(client_for, admin_user, jobs):
    answer = client_for(admin_user).post(URL, body(), format="json")
    assert answer.status_code == 201, answer.content
    row = answer.json()
    figures = row["figures"]
    # 8,760 / 2 + 0 power + 4,380 staff = 8,760 a year, for 1000 of 8,760 GPU-hours
    assert figures["yearly_cost"] == "8760.00" and figures["yearly_depreciation"] == "4380.00"
    assert figures["gpu_hours_available"] == 8760
    assert figures["utilization_measured"] == figures["utilization"] == pytest.approx(0.1142, abs=1e-4)
    assert figures["utilization_source"] == "measured"
    assert Decimal(figures["cost_per_gpu_hour"]) == Decimal("8.76")  # 8,760 / 1,000 (about)
    (cloud,) = row["cloud_prices"]
    assert cloud == {
        "provider": "cloud-a",
        "per_gpu_hour": "2.5000",
        "break_even_utilization": 0.4,
        "never_breaks_even": False,
        "cloud_yearly_cost": cloud["cloud_yearly_cost"],
        "saving_pct": cloud["saving_pct"],
    }
    # 1,000 GPU-hours × 2.50, less the seconds the year's start moved on since the jobs were placed
    assert Decimal("2499.95") <= Decimal(cloud["cloud_yearly_cost"]) <= Decimal("2500.00")
    assert cloud["saving_pct"] == pytest.approx(-250.4, abs=0.05)  # (2,500 − 8,760) / 2,500
    assert (row["currency"], row["cluster"], row["gpu_model"], row["updated_by"]) == (
        "CNY",
        "local",
        "h100-80gb",
        "admin",
    )


def test_a_what_if_utilization_and_zero(client_for, admin_user, make_job, owner):
    make_job(owner)  # the local cluster exists, nothing ran
    api = client_for(admin_user)
    made = api.post(URL, body(), format="json").json()
    assert made["figures"]["utilization"] == 0 and made["figures"]["cost_per_gpu_hour"] is None
    assert made["cloud_prices"][0]["saving_pct"] is None
    half = api.get(f"{URL}{made['id']}/?utilization=0.5").json()
    assert (
        half["figures"]["utilization_source"] == "override" and half["figures"]["utilization_measured"] == 0
    )
    assert half["figures"]["cost_per_gpu_hour"] == "2.00"  # 8,760 / 4,380
    assert half["cloud_prices"][0]["saving_pct"] == 20.0  # (10,950 − 8,760) / 10,950
    listed = api.get(f"{URL}?utilization=1").json()["results"]
    assert [r["figures"]["cost_per_gpu_hour"] for r in listed] == ["1.00"]


@pytest.mark.parametrize("bad", ["2", "-0.1", "x", "0.12345"])
def test_a_utilization_outside_zero_to_one_is_400_naming_it(client_for, admin_user, bad):
    body_ = assert_problem(client_for(admin_user).get(f"{URL}?utilization={bad}"), 400, "invalid")
    assert list(body_["errors"]) == ["utilization"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"pue": 0.9}, "pue"),
        ({"pue": 1.234}, "pue"),
        ({"node_price": 300000}, "node_price"),  # money is a decimal string, never a JSON number
        ({"node_price": "-1.00"}, "node_price"),
        ({"depreciation_years": 0}, "depreciation_years"),
        ({"nodes": "2"}, "nodes"),
        ({"gpu_model": "no-such-gpu"}, "gpu_model"),
        ({"cluster": "no-such-cluster"}, "cluster"),
        (
            {
                "cloud_prices": [
                    {"provider": "a", "per_gpu_hour": "1"},
                    {"provider": "a", "per_gpu_hour": "2"},
                ]
            },
            "cloud_prices",
        ),
    ],
)
def test_bad_input_is_400_naming_the_field(client_for, admin_user, make_job, owner, overrides, field):
    make_job(owner)
    answer = client_for(admin_user).post(URL, body(**overrides), format="json")
    assert field in assert_problem(answer, 400, "invalid")["errors"]
    assert not TcoProfile.objects.exists()


def test_a_second_profile_for_one_cluster_or_the_site_is_400_naming_cluster(
    client_for, admin_user, make_job, owner
):
    make_job(owner)
    api = client_for(admin_user)
    assert api.post(URL, body(), format="json").status_code == 201
    assert api.post(URL, body(cluster=None), format="json").status_code == 201
    for cluster in ("local", None):
        answer = api.post(URL, body(name="again", cluster=cluster), format="json")
        assert list(assert_problem(answer, 400, "invalid")["errors"]) == ["cluster"]
    assert TcoProfile.objects.count() == 2


def test_change_and_delete_are_audited(client_for, admin_user, make_job, owner):
    make_job(owner)
    api = client_for(admin_user)
    made = api.post(URL, body(), format="json").json()
    detail = f"{URL}{made['id']}/"
    changed = api.patch(
        detail, {"nodes": 2, "cloud_prices": [{"provider": "b", "per_gpu_hour": "1.0000"}]}, format="json"
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["nodes"] == 2 and changed.json()["figures"]["yearly_depreciation"] == "8760.00"
    assert [c["provider"] for c in changed.json()["cloud_prices"]] == ["b"]
    bad = api.patch(detail, {"cloud_prices": [{"provider": "c"}]}, format="json")
    assert list(assert_problem(bad, 400, "invalid")["errors"]) == ["cloud_prices.0.per_gpu_hour"]
    assert api.delete(detail).status_code == 204
    assert api.get(detail).status_code == 404
    events = list(AuditEvent.objects.filter(target_type="reports.tcoprofile").order_by("id"))
    assert [e.action for e in events] == ["tco_profile.create", "tco_profile.change", "tco_profile.delete"]
    assert events[0].data["node_price"] == "8760.00" and events[0].actor_username == "admin"
    assert events[1].data["nodes"] == [1, 2]
    assert events[1].data["cloud_prices"] == [
        [{"provider": "cloud-a", "per_gpu_hour": "2.5000"}],
        [{"provider": "b", "per_gpu_hour": "1.0000"}],
    ]


def test_only_platform_admins_read_or_write(client_for, admin_user, owner, outsider, anon_client, make_job):
    make_job(owner)
    made = client_for(admin_user).post(URL, body(), format="json").json()
    for user in (owner, outsider):
        api = client_for(user)
        assert_problem(api.get(URL), 403, "permission_denied")
        assert_problem(api.get(f"{URL}{made['id']}/"), 403, "permission_denied")
        assert_problem(api.post(URL, body(cluster=None), format="json"), 403, "permission_denied")
        assert_problem(
            api.patch(f"{URL}{made['id']}/", {"nodes": 9}, format="json"), 403, "permission_denied"
        )
        assert_problem(api.delete(f"{URL}{made['id']}/"), 403, "permission_denied")
    assert_problem(anon_client.get(URL), 401, "not_authenticated")
    assert TcoProfile.objects.get().nodes == 1


def test_the_list_costs_the_same_queries_for_one_profile_and_three(
    client_for, admin_user, jobs, django_assert_max_num_queries
):
    api = client_for(admin_user)
    api.post(URL, body(), format="json")
    with CaptureQueriesContext(connection) as one:
        assert len(api.get(URL).json()["results"]) == 1
    api.post(URL, body(name="site", cluster=None), format="json")
    ClusterFactory(slug="third")
    api.post(URL, body(name="third", cluster="third"), format="json")
    with CaptureQueriesContext(connection) as three:
        assert len(api.get(URL).json()["results"]) == 3
    assert len(three) == len(one)


def test_the_example_command_loads_published_figures_in_the_sites_currency(make_job, owner):
    with pytest.raises(CommandError, match="rate"):
        call_command("tco_example")
    call_command("tco_example", "--rate", "7")
    profile = TcoProfile.objects.get()
    assert profile.cluster is None and profile.gpu_model.slug == "h100-80gb"
    assert (profile.nodes, profile.node_price, profile.pue) == (4, Decimal("2100000.00"), Decimal("1.30"))
    assert {p.provider: p.per_gpu_hour for p in profile.cloud_prices.all()}[
        "Lambda H100 SXM on demand"
    ] == Decimal("20.9300")
    assert AuditEvent.objects.get(action="tco_profile.create").actor is None
    with pytest.raises(CommandError, match="already"):
        call_command("tco_example", "--rate", "7")
