"""Every list endpoint of tenants and quota costs the same queries at 1 row and at 20."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.core.services import audit_record
from tenants.models import Role
from tenants.services import membership_add
from tests.factories import QuotaGrantFactory, QuotaRequestFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

BUDGET = 6  # token, token touch at most, visibility subquery, page, plus the endpoint's own lookups


def add_rows(kind: str, tenant, admin, n: int) -> None:
    for _ in range(n):
        if kind == "tenants":
            membership_add(actor=None, tenant=TenantFactory(), user=admin, role=Role.VIEWER)
        elif kind == "members":
            membership_add(actor=None, tenant=tenant, user=UserFactory(), role=Role.MEMBER)
        elif kind == "quota-requests":
            QuotaRequestFactory(
                tenant=tenant,
                gpus=1,
                gpu_hours=1,
                days=0,
                justification="j",
                requested_by=admin,
                decided_by=admin,
            )
        elif kind == "quotas":
            QuotaGrantFactory(tenant=tenant, gpus=1, gpu_hours=1, days=1)
        elif kind == "audit":
            audit_record(actor=admin, action="test", target=tenant, tenant=tenant)


URLS = {
    "tenants": "/api/v1/tenants/",
    "members": "/api/v1/tenants/protein-lab/members/",
    "quota-requests": "/api/v1/quota-requests/",
    "quotas": "/api/v1/quotas/",
    "audit": "/api/v1/audit/",
}


@pytest.mark.parametrize("kind", sorted(URLS))
def test_list_query_count_does_not_grow_with_rows(kind, client_for, owner, tenant):
    client = client_for(owner)
    client.get("/api/v1/me/")  # the token's first use writes last_used; measure steady state
    add_rows(kind, tenant, owner, 1)
    with CaptureQueriesContext(connection) as one:
        first = client.get(URLS[kind] + "?page_size=50")
    add_rows(kind, tenant, owner, 19)
    with CaptureQueriesContext(connection) as twenty:
        second = client.get(URLS[kind] + "?page_size=50")
    assert first.status_code == second.status_code == 200
    assert len(second.json()["results"]) >= 20
    assert len(one) == len(twenty) <= BUDGET, [q["sql"] for q in twenty.captured_queries]
