"""/api/v1/tenants/{slug}/lending/ and /api/v1/tenants/{slug}/loans/: what a tenant lends and
borrows in its cohorts, read by any of its members and by staff who see every tenant; the other
tenant of a loan is named to those staff only, and the borrowing job to its own tenant only."""

from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.core.staff import ROLE_QUOTA_APPROVER, ROLE_READ_ONLY_SUPPORT
from tests.api_support import assert_problem
from tests.factories import (
    CohortFactory,
    CohortMemberFactory,
    JobFactory,
    LoanFactory,
    PartitionFactory,
    QuotaGrantFactory,
    TenantFactory,
    staff_user,
)

pytestmark = pytest.mark.django_db

LENDING = "/api/v1/tenants/{}/lending/"
LOANS = "/api/v1/tenants/{}/loans/"


@pytest.fixture
def climate(db):
    return TenantFactory(slug="climate")


@pytest.fixture
def cohort(tenant, climate, catalog):
    """h100-pool: protein-lab lends up to 4 and borrows up to 2; climate lends 2, borrows 8."""
    cohort = CohortFactory(slug="h100-pool", gpu_model=catalog[1], reclaim_grace_s=120)
    CohortMemberFactory(cohort=cohort, tenant=tenant, lending_limit=4, borrowing_limit=2)
    CohortMemberFactory(cohort=cohort, tenant=climate, lending_limit=2, borrowing_limit=8)
    return cohort


@pytest.fixture
def lend(cohort, tenant, climate, catalog):
    """lend(gpus, started_at, ended_at=None, reclaimed=False, lender=protein-lab): a loan of the
    lender's grant to a new job of the other tenant."""
    grants = {t.pk: QuotaGrantFactory(tenant=t, pair=catalog, gpus=8) for t in (tenant, climate)}

    def make(gpus, started_at, ended_at=None, reclaimed=False, lender=None):
        lender = lender or tenant
        borrower = climate if lender == tenant else tenant
        job = JobFactory(grant=grants[borrower.pk], gpus=gpus, preemptible=True)
        return LoanFactory(
            cohort=cohort, job=job, lender_grant=grants[lender.pk], gpus=gpus, started_at=started_at,
            ended_at=ended_at, reclaimed=reclaimed,
        )  # fmt: skip

    return make


def yesterday_at(hour: int) -> datetime:
    return datetime.combine(timezone.now().astimezone(UTC).date() - timedelta(days=1), time(hour), tzinfo=UTC)


def day_of(answer: dict, when: datetime) -> dict:
    return next(row for row in answer["daily"] if row["date"] == when.date().isoformat())


# --- The lending of a tenant


def test_a_2_gpu_loan_of_3_hours_yesterday_is_6_gpu_hours_lent_that_day(client_for, owner, lend, climate):
    start = yesterday_at(10)
    lend(2, start, start + timedelta(hours=3))
    response = client_for(owner).get(LENDING.format("protein-lab"))
    assert response.status_code == 200, response.content
    answer = response.json()
    assert day_of(answer, start) == {
        "date": start.date().isoformat(), "lent_gpu_hours": 6.0, "borrowed_gpu_hours": 0.0, "reclaimed": 0,
    }  # fmt: skip
    assert sum(row["lent_gpu_hours"] for row in answer["daily"]) == 6.0
    assert (answer["tenant"], answer["days"], len(answer["daily"])) == ("protein-lab", 30, 31)
    assert (answer["lent_gpu_hours"], answer["borrowed_gpu_hours"]) == (6.0, 0.0)
    assert (answer["lent_gpus"], answer["borrowed_gpus"]) == (0, 0)  # the loan has ended
    assert answer["cohorts"] == [
        {
            "cohort": "h100-pool", "gpu_model": "h100-80gb", "partition": None, "reclaim_grace_s": 120,
            "lending_limit": 4, "borrowing_limit": 2, "lent_gpus": 0, "borrowed_gpus": 0,
        }
    ]  # fmt: skip
    assert "climate" not in response.content.decode()  # the borrower is never named
    borrower = client_for(staff_user("support", ROLE_READ_ONLY_SUPPORT)).get(LENDING.format("climate")).json()
    assert day_of(borrower, start)["borrowed_gpu_hours"] == 6.0
    assert (borrower["lent_gpu_hours"], borrower["borrowed_gpu_hours"]) == (0.0, 6.0)


def test_open_loans_are_the_gpus_lent_and_borrowed_now(client_for, owner, lend, climate):
    lend(3, timezone.now() - timedelta(hours=2))
    lend(1, timezone.now() - timedelta(hours=1), lender=climate)
    answer = client_for(owner).get(LENDING.format("protein-lab")).json()
    assert (answer["lent_gpus"], answer["borrowed_gpus"]) == (3, 1)
    assert (answer["cohorts"][0]["lent_gpus"], answer["cohorts"][0]["borrowed_gpus"]) == (3, 1)
    assert answer["lent_gpu_hours"] == pytest.approx(6.0, abs=0.01)
    assert answer["borrowed_gpu_hours"] == pytest.approx(1.0, abs=0.01)


def test_reclaims_count_on_both_sides_on_the_day_they_ended(client_for, owner, admin_user, lend):
    start = yesterday_at(8)
    lend(2, start, start + timedelta(hours=1), reclaimed=True)
    lender = client_for(owner).get(LENDING.format("protein-lab")).json()
    assert (lender["reclaimed_from_borrowers"], lender["reclaimed_from_us"]) == (1, 0)
    assert day_of(lender, start)["reclaimed"] == 1
    borrower = client_for(admin_user).get(LENDING.format("climate")).json()
    assert (borrower["reclaimed_from_borrowers"], borrower["reclaimed_from_us"]) == (0, 1)


def test_a_cohort_of_one_partition_names_it_and_an_end_after_now_counts_to_now(
    client_for, owner, lend, cohort, catalog
):
    cohort.partition = PartitionFactory(cluster__slug="gpu-a", name="h100q", gpu_model=catalog[1])
    cohort.save(update_fields=["partition"])
    # a loan another host ended a minute ahead of this one's clock
    lend(2, timezone.now() - timedelta(hours=1), timezone.now() + timedelta(minutes=1))
    response = client_for(owner).get(LENDING.format("protein-lab"))
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["cohorts"][0]["partition"] == {"cluster": "gpu-a", "name": "h100q"}
    assert answer["lent_gpu_hours"] == pytest.approx(2.0, abs=0.01)


def test_days_bounds_the_series_and_the_totals(client_for, owner, lend):
    lend(1, timezone.now() - timedelta(days=10), timezone.now() - timedelta(days=10) + timedelta(hours=4))
    start = yesterday_at(12)
    lend(2, start, start + timedelta(hours=1))
    client = client_for(owner)
    week = client.get(LENDING.format("protein-lab") + "?days=7").json()
    assert (week["days"], len(week["daily"]), week["lent_gpu_hours"]) == (7, 8, 2.0)
    assert client.get(LENDING.format("protein-lab") + "?days=90").json()["lent_gpu_hours"] == 6.0
    assert client.get(LENDING.format("protein-lab") + "?days=").json()["days"] == 30  # empty: absent


@pytest.mark.parametrize("days", ["0", "91", "-1", "x", "7.5", "%00"])
def test_a_bad_days_is_400_naming_it(client_for, member, cohort, days):
    response = client_for(member).get(LENDING.format("protein-lab") + f"?days={days}")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["days"]


def test_a_tenant_in_no_cohort_lends_nothing(client_for, outsider):
    answer = client_for(outsider).get(LENDING.format("other-team") + "?days=1").json()
    assert (answer["cohorts"], answer["lent_gpu_hours"], len(answer["daily"])) == ([], 0.0, 2)


# --- Who reads


@pytest.mark.parametrize("persona", ["owner", "manager", "member", "viewer", "admin_user"])
def test_every_role_of_the_tenant_and_every_staff_reader_reads_it(client_for, cohort, request, persona):
    client = client_for(request.getfixturevalue(persona))
    assert client.get(LENDING.format("protein-lab")).status_code == 200
    assert client.get(LOANS.format("protein-lab")).status_code == 200


@pytest.mark.parametrize("role", [ROLE_READ_ONLY_SUPPORT, ROLE_QUOTA_APPROVER])
def test_staff_who_see_every_tenant_read_it(client_for, cohort, role):
    client = client_for(staff_user("staff", role))
    assert client.get(LENDING.format("protein-lab")).status_code == 200
    assert client.get(LOANS.format("protein-lab")).status_code == 200


@pytest.mark.parametrize(
    "url", [LENDING + "?days=0", LENDING, LOANS + "?role=bogus", LOANS + "?open=maybe", LOANS]
)
def test_another_tenant_is_404_before_its_query_is_read(client_for, outsider, cohort, url):
    assert_problem(client_for(outsider).get(url.format("protein-lab")), 404, "not_found")
    assert_problem(client_for(staff_user("bare")).get(url.format("protein-lab")), 404, "not_found")


@pytest.mark.parametrize("url", [LENDING, LOANS])
def test_no_such_tenant_is_404_and_no_credentials_401(client_for, anon_client, member, url):
    assert_problem(client_for(member).get(url.format("no-such-team")), 404, "not_found")
    assert_problem(client_for(member).get(url.format("Not_A_Slug")), 404, "not_found")
    assert_problem(anon_client.get(url.format("protein-lab")), 401, "not_authenticated")


# --- The loans of a tenant


def test_a_lender_sees_its_loans_without_the_borrower_or_its_job(client_for, owner, lend):
    start = yesterday_at(10)
    loan = lend(2, start, start + timedelta(hours=3))
    rows = client_for(owner).get(LOANS.format("protein-lab")).json()["results"]
    assert rows == [
        {
            "id": str(loan.pk), "cohort": "h100-pool", "role": "lent", "gpus": 2,
            "started_at": start.isoformat().replace("+00:00", "Z"),
            "ended_at": (start + timedelta(hours=3)).isoformat().replace("+00:00", "Z"),
            "reclaimed": False, "gpu_hours": 6.0, "job": None, "counterpart": None,
        }
    ]  # fmt: skip


def test_a_borrower_sees_its_own_job_but_not_the_lender(client_for, admin_user, member, lend, climate):
    loan = lend(1, timezone.now() - timedelta(minutes=30), lender=climate)
    rows = client_for(admin_user).get(LOANS.format("protein-lab")).json()["results"]
    assert [(r["role"], r["job"], r["counterpart"]) for r in rows] == [
        ("borrowed", str(loan.job_id), "climate")
    ]
    assert rows[0]["ended_at"] is None and rows[0]["gpu_hours"] == pytest.approx(0.5, abs=0.01)
    rows = client_for(member).get(LOANS.format("protein-lab")).json()["results"]
    assert [(r["role"], r["job"], r["counterpart"]) for r in rows] == [("borrowed", str(loan.job_id), None)]


def test_staff_who_see_every_tenant_see_the_counterpart(client_for, lend, climate):
    lend(2, timezone.now() - timedelta(hours=1))
    support = client_for(staff_user("support", ROLE_READ_ONLY_SUPPORT))
    lent = support.get(LOANS.format("protein-lab")).json()["results"]
    assert [(r["role"], r["job"], r["counterpart"]) for r in lent] == [("lent", None, "climate")]
    borrowed = support.get(LOANS.format("climate")).json()["results"]
    assert [(r["role"], r["counterpart"]) for r in borrowed] == [("borrowed", "protein-lab")]


def test_loans_filter_by_role_and_open(client_for, owner, lend, climate):
    start = yesterday_at(6)
    ended = lend(1, start, start + timedelta(hours=1))
    open_lent = lend(2, timezone.now() - timedelta(hours=1))
    borrowed = lend(3, timezone.now() - timedelta(hours=1), lender=climate)
    client = client_for(owner)

    def ids(query: str) -> list[str]:
        response = client.get(LOANS.format("protein-lab") + query)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids("") == [str(borrowed.pk), str(open_lent.pk), str(ended.pk)]  # newest first
    assert ids("?role=lent") == [str(open_lent.pk), str(ended.pk)]
    assert ids("?role=borrowed") == [str(borrowed.pk)]
    assert ids("?open=true") == [str(borrowed.pk), str(open_lent.pk)]
    assert ids("?open=false") == [str(ended.pk)]
    assert ids("?role=lent&open=true") == [str(open_lent.pk)]
    assert ids("?role=&open=") == ids("")


def test_loans_of_other_tenants_are_not_listed(client_for, owner, outsider, lend):
    lend(1, timezone.now() - timedelta(hours=1))
    assert client_for(outsider).get(LOANS.format("other-team")).json()["results"] == []
    assert len(client_for(owner).get(LOANS.format("protein-lab")).json()["results"]) == 1


@pytest.mark.parametrize(
    ("query", "field"), [("?role=bogus", "role"), ("?open=yes", "open"), ("?open=1", "open")]
)
def test_a_bad_filter_is_400_naming_it(client_for, member, cohort, query, field):
    response = client_for(member).get(LOANS.format("protein-lab") + query)
    assert list(assert_problem(response, 400, "invalid")["errors"]) == [field]


@pytest.mark.parametrize("persona", ["owner", "admin_user"])
def test_a_page_of_1_and_a_page_of_20_loans_cost_the_same_queries(
    client_for, request, persona, lend, climate
):
    for n in range(21):
        lend(1, timezone.now() - timedelta(hours=n + 1), lender=climate if n % 2 else None)
    client = client_for(request.getfixturevalue(persona))
    client.get("/api/v1/me/")  # a token's first use writes last_used

    def queries(page_size: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(LOANS.format("protein-lab") + f"?page_size={page_size}")
        assert len(response.json()["results"]) == page_size and response.json()["next"]
        return len(captured.captured_queries)

    assert queries(1) == queries(20)
