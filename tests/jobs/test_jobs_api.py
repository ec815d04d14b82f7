"""GET /api/v1/jobs/ (filters, query counts), /jobs/{id}/ as a viewer sees it, /templates/, /usage/,
and the parameters of /jobs/{id}/log/ and /events/."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.pricing import midnight
from clusters.selectors import catalog_names_forget
from jobs.models import JobState
from tenants.models import Membership, Role
from tenants.services import membership_change_role
from tests.conftest import join
from tests.jobs_support import api_submit

pytestmark = pytest.mark.django_db

NOW = timezone.now()
# Yesterday's noon in the site's time zone, and the day after it: far from any midnight.
NOON = midnight(timezone.localdate() - timedelta(days=1)) + timedelta(hours=12)
TO = timezone.localdate()


def test_job_list_costs_the_same_queries_at_1_and_20_rows(client_for, member, make_job):
    client = client_for(member)
    client.get("/api/v1/me/")
    make_job(member)
    catalog_names_forget()  # both requests read the catalog's names, as a process's first one does
    with CaptureQueriesContext(connection) as one:
        assert len(client.get("/api/v1/jobs/").json()["results"]) == 1
    for _ in range(19):
        make_job(member)
    catalog_names_forget()
    with CaptureQueriesContext(connection) as twenty:
        assert len(client.get("/api/v1/jobs/").json()["results"]) == 20
    assert len(one) == len(twenty) <= 5


def test_job_filters(client_for, member, manager, make_job):
    make_job(member, state=JobState.RUNNING)
    make_job(member, state=JobState.COMPLETED)
    make_job(manager, state=JobState.FAILED)
    client = client_for(member)

    def names(query: str) -> list[tuple[str, str]]:
        return sorted(
            (j["state"], j["submitted_by"]) for j in client.get(f"/api/v1/jobs/?{query}").json()["results"]
        )

    assert names("state=RUNNING&state=FAILED") == [("FAILED", "manager"), ("RUNNING", "member")]
    assert names("submitted_by=manager") == [("FAILED", "manager")]
    assert names("tenant=protein-lab&scenario=ai-training&cluster=local") == names("")
    assert len(names("")) == 3
    after = (NOW + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    assert names(f"created_after={after}") == []
    bad = client.get("/api/v1/jobs/?state=DONE")
    assert bad.status_code == 400 and "state" in bad.json()["errors"]


def test_usage_by_day_user_and_gpu_model(client_for, member, manager, make_job, tenant):
    # Each job ran its GPU-hours on 1 GPU up to noon: its hours land on that day.
    yesterday, today = NOON - timedelta(days=1), NOON  # the day before yesterday, and yesterday
    for user, end, hours, state in [
        (member, yesterday, "1.5", JobState.COMPLETED),
        (member, today, "2", JobState.COMPLETED),
        (manager, today, "0.5", JobState.FAILED),
    ]:
        start = end - timedelta(hours=float(hours))
        make_job(user, state=state, started_at=start, finished_at=end, gpu_hours=Decimal(hours))
    make_job(member, state=JobState.PENDING)  # never started: nothing used
    client = client_for(member)
    by_user = client.get(f"/api/v1/usage/?tenant=protein-lab&group_by=user&to={TO}").json()
    assert by_user["results"] == [
        {"key": "manager", "gpu_hours": 0.5, "cost": "0.00"},
        {"key": "member", "gpu_hours": 3.5, "cost": "0.00"},
    ]
    assert by_user["currency"] == settings.PORTAL_CURRENCY
    by_day = client.get(f"/api/v1/usage/?group_by=day&to={TO}").json()["results"]
    assert [(r["key"], r["gpu_hours"]) for r in by_day] == [
        (str(yesterday.date()), 1.5),
        (str(today.date()), 2.5),
    ]
    by_model = client.get(f"/api/v1/usage/?group_by=gpu_model&from={today.date()}&to={TO}").json()["results"]
    assert [(r["key"], r["gpu_hours"]) for r in by_model] == [("h100-80gb", 2.5)]
    reversed_range = client.get(f"/api/v1/usage/?from={today.date()}&to={yesterday.date()}")
    assert reversed_range.status_code == 400 and "from" in reversed_range.json()["errors"]
    assert client.get("/api/v1/usage/?group_by=week").status_code == 400


def test_usage_of_another_tenant_is_empty(client_for, outsider, make_job, member):
    make_job(
        member, state=JobState.COMPLETED, started_at=NOW - timedelta(hours=2), finished_at=NOW, gpu_hours=2
    )
    assert client_for(outsider).get("/api/v1/usage/?tenant=protein-lab").json()["results"] == []


def test_templates_publish_their_parameter_schemas(client_for, member):
    body = client_for(member).get("/api/v1/templates/?scenario=ai-training").json()
    slugs = {t["slug"] for t in body["results"]}
    assert {"torchrun", "horovod"} <= slugs
    assert all(t["scenario"] == "ai-training" for t in body["results"])
    torchrun = next(t for t in body["results"] if t["slug"] == "torchrun")
    assert torchrun["parameters_schema"]["type"] == "object"
    assert "script" in torchrun["parameters_schema"]["properties"]
    everything = client_for(member).get("/api/v1/templates/").json()["results"]
    assert {"gromacs", "lammps", "openfoam"} <= {t["slug"] for t in everything}


@pytest.mark.parametrize("tail", ["0", "5001", "many"])
def test_log_tail_is_bounded(client_for, member, make_job, tail):
    job = make_job(member)
    response = client_for(member).get(f"/api/v1/jobs/{job.pk}/log/?tail={tail}")
    assert response.status_code == 400 and "tail" in response.json()["errors"]


def test_a_viewer_reads_jobs_but_cannot_cancel(client_for, tenant, member, make_job):
    viewer = join(tenant, "viewer2", Role.VIEWER)
    job = make_job(member)
    client = client_for(viewer)
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert client.get(f"/api/v1/jobs/{job.pk}/log/").json() == {"lines": [], "truncated": False}
    assert client.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403


def test_a_viewer_sees_neither_script_nor_env(client_for, member, viewer, local_partition, grant):
    job_id = api_submit(client_for(member), env={"TOKEN": "s3cret"})["id"]
    assert client_for(member).get(f"/api/v1/jobs/{job_id}/").json()["env"]["TOKEN"] == "s3cret"
    seen = client_for(viewer).get(f"/api/v1/jobs/{job_id}/")
    assert seen.status_code == 200 and "s3cret" not in seen.content.decode() and "script" not in seen.json()


@pytest.mark.parametrize(
    ("url", "field"), [("/api/v1/usage/?to=0001-01-05", "to"), ("/api/v1/usage/?from=9999-12-31", "from")]
)
def test_usage_dates_at_the_ends_of_the_calendar_are_400_not_500(client_for, admin_user, owner, url, field):
    response = client_for(admin_user).get(url, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


@pytest.fixture
def job(make_job, member):
    """A queued job of the member's, on a local partition, under a grant."""
    return make_job(member)


@pytest.mark.parametrize(
    "moment",
    [
        "1336-11-08T16:21:23.834-22:04",  # RFC 3339 allows ±23:59; PostgreSQL stops at ±15:59
        "0001-01-01T00:00:00+14:00",  # before year 1 once in UTC
        "9999-12-31T23:59:59-14:00",  # after 9999 once in UTC
    ],
)
def test_a_time_with_any_offset_filters_jobs(client_for, member, job, moment):
    moment = moment.replace("+", "%2B")
    after = client_for(member).get(f"/api/v1/jobs/?created_after={moment}")
    before = client_for(member).get(f"/api/v1/jobs/?created_before={moment}")
    assert after.status_code == before.status_code == 200
    assert len(after.json()["results"]) + len(before.json()["results"]) == 1


def test_a_jobs_events_and_log_do_not_take_the_job_lists_filters(client_for, member, job):
    # get_object() applied the list's filter set: ?state=RUNNING made a queued job a 404.
    client = client_for(member)
    assert client.get(f"/api/v1/jobs/{job.pk}/events/?state=RUNNING").status_code == 200
    assert client.get(f"/api/v1/jobs/{job.pk}/events/?state=nonsense").status_code == 200


def test_templates_with_an_empty_scenario_are_all_templates(client_for, member):
    client = client_for(member)
    every = client.get("/api/v1/templates/").json()["results"]
    assert every and client.get("/api/v1/templates/?scenario=").json()["results"] == every


@pytest.mark.parametrize(
    ("role", "detailed"),
    [(Role.OWNER, True), (Role.MANAGER, True), (Role.MEMBER, False), (Role.VIEWER, False)],
)
def test_the_detail_is_for_the_submitter_owners_and_managers(
    client_for, member, tenant, local_partition, grant, role, detailed
):
    """Another person of the tenant reads the job; its script only as an owner or manager. The
    job's row and the reader's rights come from one query (jobs.selectors)."""
    job_id = api_submit(client_for(member))["id"]
    reader = join(tenant, f"reader-{role}", role)
    seen = client_for(reader).get(f"/api/v1/jobs/{job_id}/")
    assert seen.status_code == 200 and ("script" in seen.json()) is detailed


def test_a_submitter_who_may_no_longer_submit_reads_no_detail(
    client_for, member, owner, tenant, local_partition, grant
):
    job_id = api_submit(client_for(member))["id"]
    membership_change_role(
        actor=owner, membership=Membership.objects.get(tenant=tenant, user=member), role=Role.VIEWER
    )
    seen = client_for(member).get(f"/api/v1/jobs/{job_id}/")
    assert seen.status_code == 200 and "script" not in seen.json()
