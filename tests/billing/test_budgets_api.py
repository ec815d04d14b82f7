"""/api/v1/tenants/{slug}/budgets/: every member and staff who see every tenant read them with
their figures; owners, managers and platform admins set, change and remove them, audited; another
tenant's answers 404 before its body is read; bad input is a 400 naming the field."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import Budget
from portal.core.models import AuditEvent
from tests.api_support import assert_problem
from tests.budgets_support import priced
from tests.factories import QuotaGrantFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/protein-lab/budgets/"


def test_a_viewer_reads_the_budgets_with_their_figures(client_for, tenant, viewer, make_job, catalog):
    priced(catalog[1])
    make_job(viewer, reserved_gpu_hours=Decimal("2.5"))  # 25.00 reserved
    Budget.objects.create(tenant=tenant, period="month", amount=Decimal(100), hard=True)
    answer = client_for(viewer).get(URL)
    assert answer.status_code == 200
    (row,) = answer.json()["results"]
    assert row | {"id": None, "period_start": None, "period_end": None} == {
        "id": None, "period": "month", "grant": None, "amount": "100.00", "hard": True, "currency": "CNY",
        "period_start": None, "period_end": None, "spent": "0.00", "reserved": "25.00", "left": "75.00",
        "percent": 25.0,
    }  # fmt: skip


def test_owners_and_managers_write_members_may_not_outsiders_see_nothing(
    client_for, tenant, owner, manager, member, outsider, admin_user, grant
):
    assert_problem(client_for(member).post(URL, {"period": "month", "amount": "10"}, format="json"), 403,
                   "permission_denied")  # fmt: skip
    # Another tenant's: 404 before the body is read, bad or not.
    assert_problem(client_for(outsider).get(URL), 404, "not_found")
    assert_problem(client_for(outsider).post(URL, {"period": "nonsense"}, format="json"), 404, "not_found")

    made = client_for(owner).post(URL, {"period": "month", "amount": "1000.5"}, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["amount"], made.json()["hard"]) == ("1000.50", False)
    budget_url = f"{URL}{made.json()['id']}/"
    changed = client_for(manager).patch(budget_url, {"hard": True, "amount": "900"}, format="json")
    assert (changed.status_code, changed.json()["amount"], changed.json()["hard"]) == (200, "900.00", True)
    assert_problem(
        client_for(member).patch(budget_url, {"hard": False}, format="json"), 403, "permission_denied"
    )
    assert_problem(client_for(outsider).patch(budget_url, {"hard": "x"}, format="json"), 404, "not_found")
    assert_problem(client_for(outsider).delete(budget_url), 404, "not_found")
    # A second monthly budget is a conflict; a platform admin sets the grant's.
    assert_problem(
        client_for(owner).post(URL, {"period": "month", "amount": "5"}, format="json"), 409, "conflict"
    )
    per_grant = {"period": "grant", "grant": str(grant.pk), "amount": "50", "hard": True}
    assert client_for(admin_user).post(URL, per_grant, format="json").status_code == 201
    assert client_for(manager).delete(budget_url).status_code == 204
    assert list(Budget.objects.values_list("period", "grant_id")) == [("grant", grant.pk)]
    actions = list(
        AuditEvent.objects.filter(action__startswith="budget.")
        .values_list("action", "actor_username")
        .order_by("id")
    )
    assert actions == [("budget.create", "owner"), ("budget.change", "manager"), ("budget.create", "admin"),
                       ("budget.delete", "manager")]  # fmt: skip
    assert AuditEvent.objects.get(action="budget.change").data == {"changed": ["amount", "hard"],
                                                                    "amount": "900.00", "hard": True}  # fmt: skip


def test_another_tenants_budget_is_404_on_this_tenants_path(client_for, owner, other_tenant):
    theirs = Budget.objects.create(tenant=other_tenant, period="month", amount=Decimal(10))
    assert_problem(client_for(owner).patch(f"{URL}{theirs.pk}/", {"hard": True}, format="json"), 404,
                   "not_found")  # fmt: skip
    assert_problem(client_for(owner).delete(f"{URL}{theirs.pk}/"), 404, "not_found")
    assert Budget.objects.get(pk=theirs.pk).hard is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"period": "month", "amount": 10}, "amount"),  # a JSON number, not a decimal string
        ({"period": "month", "amount": "0"}, "amount"),
        ({"period": "month", "amount": "1.005"}, "amount"),  # a third decimal
        ({"period": "month", "amount": "10", "hard": "yes"}, "hard"),
        ({"period": "week", "amount": "10"}, "period"),
        ({"period": "grant", "amount": "10"}, "grant"),  # names no grant
        ({"period": "month", "grant": "1", "amount": "10"}, "grant"),
        ({"period": "grant", "grant": "not-an-id", "amount": "10"}, "grant"),
    ],
)
def test_bad_input_is_400_naming_the_field(client_for, owner, body, field):
    problem = assert_problem(client_for(owner).post(URL, body, format="json"), 400, "invalid")
    assert list(problem["errors"]) == [field]


def test_a_grant_of_another_tenant_is_400_naming_grant(client_for, owner, other_tenant, catalog):
    theirs = QuotaGrantFactory(tenant=other_tenant, pair=catalog)
    body = {"period": "grant", "grant": str(theirs.pk), "amount": "10"}
    assert list(
        assert_problem(client_for(owner).post(URL, body, format="json"), 400, "invalid")["errors"]
    ) == ["grant"]
    assert not Budget.objects.exists()


def test_the_list_takes_the_same_queries_for_1_and_20_jobs(client_for, tenant, member, make_job, catalog):
    priced(catalog[1])
    Budget.objects.create(tenant=tenant, period="month", amount=Decimal(100))
    client = client_for(member)
    make_job(member, reserved_gpu_hours=Decimal(1))
    client.get(URL)  # warm: content types, permissions
    with CaptureQueriesContext(connection) as one:
        assert client.get(URL).json()["results"][0]["reserved"] == "10.00"
    for _ in range(19):
        make_job(member, reserved_gpu_hours=Decimal(1))
    with CaptureQueriesContext(connection) as twenty:
        assert client.get(URL).json()["results"][0]["reserved"] == "200.00"
    assert len(twenty) == len(one) <= 8, [q["sql"] for q in twenty.captured_queries]
