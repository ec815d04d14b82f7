"""What the API keeps between reads: the caller's tenant permissions for one request
(tenants.selectors.tenant_perm_map), the catalog's names in the process for a minute
(clusters.selectors.catalog_names). Neither may answer what has changed."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from clusters import selectors as catalog
from tenants.models import Membership, Role, TenantUserPermission
from tenants.roles import CANCEL_ANY_JOB, SUBMIT_JOB, VIEW
from tenants.selectors import tenant_id_list_visible_to, tenant_perms, tenant_perms_memoized
from tenants.services import membership_change_role, membership_remove

pytestmark = pytest.mark.django_db


def sql_of(client, url: str) -> tuple[list[str], dict]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content
    return [q["sql"] for q in captured.captured_queries], response.json()


@pytest.fixture
def owner_client(client_for, owner):
    client = client_for(owner)
    client.get("/api/v1/me/")  # a token's first use writes last_used
    return client


def test_a_job_answer_reads_the_callers_permissions_once(owner_client, owner, make_job):
    job = make_job(owner, env={"K": "v"})
    sql, body = sql_of(owner_client, f"/api/v1/jobs/{job.id}/")
    # Two checks, one read: the job is in a tenant the owner may view, and the owner may read
    # its environment.
    assert body["env"] == {"K": "v"}
    assert sum("tenants_tenantuserpermission" in q for q in sql) == 1


def test_a_role_changed_within_the_request_is_read_again(tenant, owner, member):
    membership = Membership.objects.get(tenant=tenant, user=member)
    with tenant_perms_memoized():
        assert SUBMIT_JOB in tenant_perms(user=member, tenant=tenant)
        membership_change_role(actor=owner, membership=membership, role=Role.VIEWER)
        assert SUBMIT_JOB not in tenant_perms(user=member, tenant=tenant)
        assert VIEW in tenant_perms(user=member, tenant=tenant)
        membership_change_role(actor=owner, membership=membership, role=Role.MANAGER)
        assert CANCEL_ANY_JOB in tenant_perms(user=member, tenant=tenant)


def test_a_member_removed_within_the_request_sees_the_tenant_no_more(tenant, owner, member):
    membership = Membership.objects.get(tenant=tenant, user=member)
    with tenant_perms_memoized():
        assert tenant_id_list_visible_to(user=member) == [tenant.id]
        membership_remove(actor=owner, membership=membership)
        assert tenant_id_list_visible_to(user=member) == []
        assert tenant_perms(user=member, tenant=tenant) == frozenset()


def test_each_user_has_their_own_permissions_within_a_request(tenant, owner, member, outsider):
    with tenant_perms_memoized():
        assert CANCEL_ANY_JOB in tenant_perms(user=owner, tenant=tenant)
        assert CANCEL_ANY_JOB not in tenant_perms(user=member, tenant=tenant)
        assert tenant_perms(user=outsider, tenant=tenant) == frozenset()
        assert (
            tenant_id_list_visible_to(user=outsider) != tenant_id_list_visible_to(user=owner) == [tenant.id]
        )


def test_a_change_rolled_back_within_the_request_is_not_remembered(tenant, owner, member):
    membership = Membership.objects.get(tenant=tenant, user=member)
    with tenant_perms_memoized():
        assert SUBMIT_JOB in tenant_perms(user=member, tenant=tenant)
        with pytest.raises(RuntimeError), transaction.atomic():
            membership_change_role(actor=owner, membership=membership, role=Role.VIEWER)
            assert SUBMIT_JOB not in tenant_perms(user=member, tenant=tenant)
            raise RuntimeError  # the request fails after the change: it rolls back
        assert SUBMIT_JOB in tenant_perms(user=member, tenant=tenant)


def test_outside_a_request_every_read_is_fresh(tenant, member):
    assert SUBMIT_JOB in tenant_perms(user=member, tenant=tenant)
    TenantUserPermission.objects.filter(user=member).delete()  # as another process would
    assert tenant_perms(user=member, tenant=tenant) == frozenset()


def test_the_next_request_reads_the_permissions_afresh(client_for, member, make_job):
    job = make_job(member)
    client = client_for(member)
    assert client.get(f"/api/v1/jobs/{job.id}/").status_code == 200
    TenantUserPermission.objects.filter(user=member).delete()  # another process removed them
    response = client.get(f"/api/v1/jobs/{job.id}/")
    assert response.status_code == 404, response.content


def test_a_second_answer_reads_no_catalog(owner_client, owner, make_job):
    first, second = make_job(owner), make_job(owner)
    sql, body = sql_of(owner_client, f"/api/v1/jobs/{first.id}/")
    assert sum("clusters_scenario" in q for q in sql) == 1
    assert (body["scenario"], body["cluster"], body["partition"]) == ("ai-training", "local", "local")
    sql, body = sql_of(owner_client, f"/api/v1/jobs/{second.id}/")
    assert not [q for q in sql if "clusters_" in q]
    assert (body["scenario"], body["cluster"], body["partition"]) == ("ai-training", "local", "local")


def test_a_rename_saved_here_shows_in_the_next_answer(owner_client, owner, make_job):
    job = make_job(owner)
    assert sql_of(owner_client, f"/api/v1/jobs/{job.id}/")[1]["scenario"] == "ai-training"
    job.scenario.slug = "deep-learning"
    job.scenario.save()
    job.partition.name = "gpu"
    job.partition.save()
    body = sql_of(owner_client, f"/api/v1/jobs/{job.id}/")[1]
    assert (body["scenario"], body["partition"]) == ("deep-learning", "gpu")


def test_a_rename_made_elsewhere_shows_once_the_names_are_old(owner_client, owner, make_job, monkeypatch):
    job = make_job(owner)
    assert sql_of(owner_client, f"/api/v1/jobs/{job.id}/")[1]["cluster"] == "local"
    type(job.cluster).objects.filter(pk=job.cluster_id).update(slug="renamed")  # no signal here
    assert sql_of(owner_client, f"/api/v1/jobs/{job.id}/")[1]["cluster"] == "local"  # within the TTL
    later = catalog.time.monotonic() + catalog.NAMES_TTL_S + 1  # the process's names are now old
    monkeypatch.setattr(catalog.time, "monotonic", lambda: later)
    assert sql_of(owner_client, f"/api/v1/jobs/{job.id}/")[1]["cluster"] == "renamed"
