"""/api/v1/cohorts/ and /api/v1/cohorts/{slug}/members/{tenant_slug}/: platform admins keep the
cohorts of tenants that lend each other GPUs; staff who see every tenant read them all; a tenant's
members read its cohorts with only their own tenant's member row; the order of 404, 403 and 400."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from jobs.models import Loan
from portal.core.models import AuditEvent
from portal.core.staff import ROLE_QUOTA_APPROVER, ROLE_READ_ONLY_SUPPORT
from portal.core.tokens import token_create
from tenants.models import Cohort, CohortMember, Role
from tests.api_support import assert_problem
from tests.conftest import join
from tests.factories import (
    ClusterFactory,
    CohortFactory,
    CohortMemberFactory,
    JobFactory,
    LoanFactory,
    PartitionFactory,
    QuotaGrantFactory,
    TenantFactory,
    catalog_pair,
    staff_user,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/cohorts/"


@pytest.fixture
def climate(db):
    return TenantFactory(slug="climate")


@pytest.fixture
def cohort(tenant, climate, catalog):
    """h100-pool: protein-lab (lends 4, borrows 2) and climate (lends 2) on every H100 partition."""
    cohort = CohortFactory(slug="h100-pool", name="H100 pool", gpu_model=catalog[1])
    CohortMemberFactory(cohort=cohort, tenant=tenant, lending_limit=4, borrowing_limit=2)
    CohortMemberFactory(cohort=cohort, tenant=climate, lending_limit=2, borrowing_limit=0)
    return cohort


@pytest.fixture
def support(db):
    return staff_user("support", ROLE_READ_ONLY_SUPPORT)


@pytest.fixture
def approver(db):
    return staff_user("approver", ROLE_QUOTA_APPROVER)


@pytest.fixture
def partitions(catalog):
    """Two H100 partitions of one cluster, and one of another GPU model."""
    cluster = ClusterFactory(slug="hpc")
    other_model = catalog_pair("ai-training", "a100-80gb")[1]
    return {
        "gpu-a": PartitionFactory(cluster=cluster, name="gpu-a", gpu_model=catalog[1]),
        "gpu-b": PartitionFactory(cluster=cluster, name="gpu-b", gpu_model=catalog[1]),
        "a100": PartitionFactory(cluster=cluster, name="a100", gpu_model=other_model),
    }


def members_of(answer: dict) -> dict:
    return {row["tenant"]: (row["lending_limit"], row["borrowing_limit"]) for row in answer["members"]}


# --- Platform admins keep cohorts


def test_an_admin_creates_reads_changes_and_deletes_a_cohort(client_for, admin_user, catalog):
    client = client_for(admin_user)
    response = client.post(URL, {"slug": "pool", "name": "Pool", "gpu_model": "h100-80gb"}, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert set(created) == {"slug", "name", "gpu_model", "partition", "reclaim_grace_s", "members", "created"}
    assert (created["slug"], created["gpu_model"], created["partition"]) == ("pool", "h100-80gb", None)
    assert (created["reclaim_grace_s"], created["members"]) == (300, [])
    assert client.get(f"{URL}pool/").json() == created
    assert [row["slug"] for row in client.get(URL).json()["results"]] == ["pool"]

    response = client.patch(f"{URL}pool/", {"name": "Shared pool", "reclaim_grace_s": 600}, format="json")
    assert response.status_code == 200
    assert (response.json()["name"], response.json()["reclaim_grace_s"]) == ("Shared pool", 600)

    assert client.delete(f"{URL}pool/").status_code == 204
    assert_problem(client.get(f"{URL}pool/"), 404, "not_found")
    events = list(AuditEvent.objects.filter(action__startswith="cohort.").order_by("id"))
    assert [(e.action, e.tenant_slug, e.actor_username) for e in events] == [
        ("cohort.create", "", "admin"),
        ("cohort.update", "", "admin"),
        ("cohort.delete", "", "admin"),
    ]
    assert events[1].data == {"name": ["Pool", "Shared pool"], "reclaim_grace_s": [300, 600]}


def test_a_cohort_on_one_partition_names_it_by_cluster_and_name(client_for, admin_user, partitions):
    client = client_for(admin_user)
    body = {"slug": "pool-a", "gpu_model": "h100-80gb", "partition": {"cluster": "hpc", "name": "gpu-a"}}
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["partition"] == {"cluster": "hpc", "name": "gpu-a"}
    moved = client.patch(f"{URL}pool-a/", {"partition": {"cluster": "hpc", "name": "gpu-b"}}, format="json")
    assert moved.json()["partition"] == {"cluster": "hpc", "name": "gpu-b"}
    every = client.patch(f"{URL}pool-a/", {"partition": None}, format="json")
    assert every.json()["partition"] is None
    assert Cohort.objects.get(slug="pool-a").partition is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "Pool"}, "slug"),
        ({"slug": "-pool"}, "slug"),
        ({"slug": "p" * 64}, "slug"),
        ({"slug": "taken"}, "slug"),
        ({"gpu_model": "no-such-gpu"}, "gpu_model"),
        ({"gpu_model": "h100\x00"}, "gpu_model"),
        ({"reclaim_grace_s": 9}, "reclaim_grace_s"),
        ({"reclaim_grace_s": 3601}, "reclaim_grace_s"),
        ({"reclaim_grace_s": "300"}, "reclaim_grace_s"),
        ({"name": 5}, "name"),
        ({"partition": {"cluster": "hpc", "name": "nope"}}, "partition"),
        ({"partition": {"cluster": "hpc"}}, "partition.name"),
        ({"partition": "hpc/gpu-a"}, "partition.non_field_errors"),
        ({"partition": {"cluster": "hpc", "name": "a100"}}, "partition"),  # another GPU model's
    ],
)
def test_a_bad_cohort_is_400_naming_the_field(client_for, admin_user, partitions, body, field):
    CohortFactory(slug="taken")
    response = client_for(admin_user).post(
        URL, {"slug": "pool", "gpu_model": "h100-80gb"} | body, format="json"
    )
    assert field in assert_problem(response, 400, "invalid")["errors"]
    assert not Cohort.objects.filter(slug="pool").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reclaim_grace_s": 0}, "reclaim_grace_s"),
        ({"partition": {"cluster": "hpc", "name": "a100"}}, "partition"),
        ({"name": "x" * 201}, "name"),
    ],
)
def test_a_bad_change_is_400_naming_the_field(client_for, admin_user, cohort, partitions, body, field):
    response = client_for(admin_user).patch(f"{URL}h100-pool/", body, format="json")
    assert field in assert_problem(response, 400, "invalid")["errors"]


def test_slug_and_gpu_model_stay_as_they_were(client_for, admin_user, cohort):
    response = client_for(admin_user).patch(
        f"{URL}h100-pool/", {"slug": "new", "gpu_model": "x"}, format="json"
    )
    assert (response.json()["slug"], response.json()["gpu_model"]) == ("h100-pool", "h100-80gb")


# --- Who reads what


def test_staff_who_see_every_tenant_read_every_member(client_for, admin_user, support, approver, cohort):
    for user in (admin_user, support, approver):
        client = client_for(user)
        answer = client.get(f"{URL}h100-pool/").json()
        assert members_of(answer) == {"climate": (2, 0), "protein-lab": (4, 2)}
        assert [row["slug"] for row in client.get(URL).json()["results"]] == ["h100-pool"]


@pytest.mark.parametrize("persona", ["owner", "member", "viewer"])
def test_a_member_of_a_cohort_tenant_reads_only_its_own_member_row(client_for, cohort, request, persona):
    client = client_for(request.getfixturevalue(persona))
    answer = client.get(f"{URL}h100-pool/").json()
    assert members_of(answer) == {"protein-lab": (4, 2)}  # climate is never named to them
    assert "climate" not in str(client.get(URL).content)
    assert [row["slug"] for row in client.get(URL).json()["results"]] == ["h100-pool"]


def test_a_cohort_none_of_the_callers_tenants_is_in_is_404(client_for, outsider, cohort):
    client = client_for(outsider)
    assert client.get(URL).json()["results"] == []
    assert_problem(client.get(f"{URL}h100-pool/"), 404, "not_found")


def test_staff_without_a_role_read_only_their_own_tenants_cohorts(client_for, cohort):
    bare = staff_user("bare")
    assert client_for(bare).get(URL).json()["results"] == []
    assert_problem(client_for(bare).get(f"{URL}h100-pool/"), 404, "not_found")


def test_no_credentials_is_401(anon_client, cohort):
    assert_problem(anon_client.get(URL), 401, "not_authenticated")
    assert_problem(anon_client.get(f"{URL}h100-pool/"), 401, "not_authenticated")
    assert_problem(anon_client.post(URL, {}, format="json"), 401, "not_authenticated")
    assert_problem(
        anon_client.put(f"{URL}h100-pool/members/climate/", {}, format="json"), 401, "not_authenticated"
    )


# --- Who writes: platform admins; 404 for a cohort the caller cannot see, 403, then the body


WRITES = [
    ("post", URL, {"slug": 5}),
    ("patch", f"{URL}h100-pool/", {"reclaim_grace_s": "never"}),
    ("delete", f"{URL}h100-pool/", None),
    ("put", f"{URL}h100-pool/members/climate/", {"lending_limit": -1}),
    ("delete", f"{URL}h100-pool/members/climate/", None),
]


@pytest.mark.parametrize(("method", "url", "body"), WRITES)
@pytest.mark.parametrize("persona", ["owner", "support", "approver"])
def test_who_sees_the_cohort_but_is_no_platform_admin_gets_403_before_the_body(
    client_for, cohort, request, persona, method, url, body
):
    client = client_for(request.getfixturevalue(persona))
    response = getattr(client, method)(url, body, format="json")
    assert_problem(response, 403, "permission_denied")
    assert Cohort.objects.get(slug="h100-pool").reclaim_grace_s == 300
    assert CohortMember.objects.filter(cohort=cohort).count() == 2


@pytest.mark.parametrize(("method", "url", "body"), WRITES[1:])
def test_who_cannot_see_the_cohort_gets_404_before_the_body(client_for, outsider, cohort, method, url, body):
    response = getattr(client_for(outsider), method)(url, body, format="json")
    assert_problem(response, 404, "not_found")


def test_an_admin_through_a_token_without_staff_powers_gets_token_scope(admin_user, cohort):
    _, key = token_create(user=admin_user, scope="submit")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert_problem(
        client.post(URL, {"slug": "x", "gpu_model": "h100-80gb"}, format="json"), 403, "token_scope"
    )
    assert_problem(client.get(f"{URL}h100-pool/"), 404, "not_found")  # a member of no cohort tenant


# --- Members


def test_an_admin_sets_changes_and_removes_a_member(client_for, admin_user, cohort, other_tenant):
    client = client_for(admin_user)
    url = f"{URL}h100-pool/members/other-team/"
    response = client.put(url, {"lending_limit": 1, "borrowing_limit": 3}, format="json")
    assert response.status_code == 201, response.content
    assert set(response.json()) == {"tenant", "lending_limit", "borrowing_limit", "joined"}
    assert (response.json()["tenant"], response.json()["lending_limit"]) == ("other-team", 1)
    changed = client.put(url, {"lending_limit": 0, "borrowing_limit": 3}, format="json")
    assert (changed.status_code, changed.json()["lending_limit"]) == (200, 0)
    assert client.put(url, {"lending_limit": 0, "borrowing_limit": 3}, format="json").status_code == 200
    assert members_of(client.get(f"{URL}h100-pool/").json())["other-team"] == (0, 3)

    assert client.delete(url).status_code == 204
    assert_problem(client.delete(url), 404, "not_found")
    assert "other-team" not in members_of(client.get(f"{URL}h100-pool/").json())
    events = AuditEvent.objects.filter(action__startswith="cohort.member.").order_by("id")
    # audited in the tenant's own log; the unchanged second PUT is not an event
    assert [(e.action, e.tenant_slug) for e in events] == [
        ("cohort.member.set", "other-team"),
        ("cohort.member.set", "other-team"),
        ("cohort.member.remove", "other-team"),
    ]
    assert events[0].data == {
        "cohort": "h100-pool", "created": True, "lending_limit": 1, "borrowing_limit": 3, "before": None,
    }  # fmt: skip
    assert events[1].data["before"] == {"lending_limit": 1, "borrowing_limit": 3}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"lending_limit": -1, "borrowing_limit": 0}, "lending_limit"),
        ({"lending_limit": 0, "borrowing_limit": 4097}, "borrowing_limit"),
        ({"lending_limit": "2", "borrowing_limit": 0}, "lending_limit"),
        ({"lending_limit": 1.5, "borrowing_limit": 0}, "lending_limit"),
        ({"lending_limit": True, "borrowing_limit": 0}, "lending_limit"),
        ({"borrowing_limit": 0}, "lending_limit"),
        ({"lending_limit": 0}, "borrowing_limit"),
    ],
)
def test_bad_limits_are_400_naming_the_field(client_for, admin_user, cohort, body, field):
    response = client_for(admin_user).put(f"{URL}h100-pool/members/climate/", body, format="json")
    assert field in assert_problem(response, 400, "invalid")["errors"]
    assert CohortMember.objects.get(cohort=cohort, tenant__slug="climate").lending_limit == 2


def test_a_tenant_that_does_not_exist_is_404(client_for, admin_user, cohort):
    client = client_for(admin_user)
    body = {"lending_limit": 1, "borrowing_limit": 1}
    assert_problem(client.put(f"{URL}h100-pool/members/no-such-team/", body, format="json"), 404, "not_found")
    assert_problem(client.put(f"{URL}h100-pool/members/Not_A_Slug/", body, format="json"), 404, "not_found")
    assert_problem(client.put(f"{URL}no-such-pool/members/climate/", body, format="json"), 404, "not_found")


def test_a_cohort_change_is_in_each_members_audit_log_and_names_no_other_tenant(
    client_for, admin_user, owner, cohort
):
    client_for(admin_user).patch(f"{URL}h100-pool/", {"reclaim_grace_s": 120}, format="json")
    events = AuditEvent.objects.filter(action="cohort.update")
    assert sorted(e.tenant_slug for e in events) == ["climate", "protein-lab"]
    mine = client_for(owner).get("/api/v1/audit/?action=cohort.update").json()["results"]
    assert [(e["tenant"], e["data"]) for e in mine] == [("protein-lab", {"reclaim_grace_s": [300, 120]})]


# --- One cohort per GPU model and partition for a tenant


def test_a_tenant_in_two_cohorts_of_a_gpu_model_on_overlapping_partitions_is_409(
    client_for, admin_user, cohort, partitions, other_tenant
):
    client = client_for(admin_user)
    limits = {"lending_limit": 1, "borrowing_limit": 1}
    for slug, partition in (("pool-a", "gpu-a"), ("pool-b", "gpu-b")):
        body = {"slug": slug, "gpu_model": "h100-80gb", "partition": {"cluster": "hpc", "name": partition}}
        assert client.post(URL, body, format="json").status_code == 201
    # protein-lab's h100-pool covers every partition: it overlaps both
    body = assert_problem(
        client.put(f"{URL}pool-a/members/protein-lab/", limits, format="json"), 409, "conflict"
    )
    assert "h100-pool" in body["detail"]
    # other-team is in no cohort: one cohort per partition is fine, two on one are not
    assert client.put(f"{URL}pool-a/members/other-team/", limits, format="json").status_code == 201
    assert client.put(f"{URL}pool-b/members/other-team/", limits, format="json").status_code == 201
    assert_problem(client.put(f"{URL}h100-pool/members/other-team/", limits, format="json"), 409, "conflict")
    moved = client.patch(f"{URL}pool-b/", {"partition": {"cluster": "hpc", "name": "gpu-a"}}, format="json")
    assert_problem(moved, 409, "conflict")
    assert_problem(client.patch(f"{URL}pool-b/", {"partition": None}, format="json"), 409, "conflict")
    assert Cohort.objects.get(slug="pool-b").partition.name == "gpu-b"
    # a cohort of another GPU model is another matter
    a100 = {"slug": "a100-pool", "gpu_model": "a100-80gb"}
    assert client.post(URL, a100, format="json").status_code == 201
    assert client.put(f"{URL}a100-pool/members/protein-lab/", limits, format="json").status_code == 201


# --- A cohort that has lent


def test_deleting_a_cohort_with_an_open_loan_is_409(client_for, admin_user, cohort, tenant, climate, catalog):
    borrowing = QuotaGrantFactory(tenant=climate, pair=catalog)
    LoanFactory(cohort=cohort, job=JobFactory(grant=borrowing), lender_grant=QuotaGrantFactory(tenant=tenant))
    body = assert_problem(client_for(admin_user).delete(f"{URL}h100-pool/"), 409, "conflict")
    assert "h100-pool" in body["detail"]
    assert CohortMember.objects.filter(cohort=cohort).count() == 2
    assert not AuditEvent.objects.filter(action="cohort.delete").exists()
    # removing its members stops its lending; once the loan has ended the cohort may go, and
    # the loan stays on record without it
    assert client_for(admin_user).delete(f"{URL}h100-pool/members/climate/").status_code == 204
    loan = Loan.objects.get()
    loan.ended_at = loan.started_at + timedelta(hours=1)
    loan.save(update_fields=["ended_at"])
    assert client_for(admin_user).delete(f"{URL}h100-pool/").status_code == 204
    loan.refresh_from_db()
    assert loan.cohort_id is None and not Cohort.objects.filter(slug="h100-pool").exists()
    assert AuditEvent.objects.filter(action="cohort.delete").exists()


# --- Query counts


@pytest.mark.parametrize("persona", ["admin_user", "owner"])
def test_a_page_of_1_and_a_page_of_20_cohorts_cost_the_same_queries(
    client_for, request, persona, tenant, catalog
):
    for n in range(21):
        cohort = CohortFactory(slug=f"pool-{n:02}", gpu_model=catalog[1])
        CohortMemberFactory(cohort=cohort, tenant=tenant)
        CohortMemberFactory(cohort=cohort)
    client = client_for(request.getfixturevalue(persona))
    client.get("/api/v1/me/")  # a token's first use writes last_used

    def queries(page_size: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(f"{URL}?page_size={page_size}")
        assert len(response.json()["results"]) == page_size and response.json()["next"]
        return len(captured.captured_queries)

    assert queries(1) == queries(20)


def test_cursors_page_through_cohorts_by_slug(client_for, owner, tenant, catalog):
    for slug in ("c", "a", "b"):
        CohortMemberFactory(cohort=CohortFactory(slug=slug, gpu_model=catalog[1]), tenant=tenant)
    client = client_for(owner)
    first = client.get(f"{URL}?page_size=2").json()
    second = client.get(first["next"]).json()
    assert [c["slug"] for c in first["results"] + second["results"]] == ["a", "b", "c"]


def test_a_member_joins_as_any_role_sees(client_for, cohort, other_tenant):
    """A user who joins a cohort tenant later sees the cohort from then on."""
    newcomer = join(other_tenant, "newcomer", Role.VIEWER)
    client = client_for(newcomer)
    assert client.get(URL).json()["results"] == []
    CohortMemberFactory(cohort=cohort, tenant=other_tenant)
    assert members_of(client.get(f"{URL}h100-pool/").json()) == {"other-team": (4, 4)}
