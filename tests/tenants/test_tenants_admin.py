"""The admin console for tenants and quota: it writes through the same services as the API."""

import pytest
from django.core import mail

from portal.core.models import AuditEvent
from tenants.models import Membership, QuotaGrant, QuotaRequest, RequestState, Role, Tenant
from tenants.roles import ROLE_PERMISSIONS
from tenants.selectors import tenant_perms
from tests.conftest import join
from tests.factories import QuotaGrantFactory, QuotaRequestFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, admin_user):
    client.force_login(admin_user)
    return client


def change_form(tenant, roles: dict[Membership, str], **fields) -> dict:
    """The tenant's change form in the console: its fields (`fields` replacing them) and a row per
    membership with the role it is to have."""
    data = {
        "slug": tenant.slug, "name": tenant.name, "tier": tenant.tier, "state": "active", "contact_email": "",
        "memberships-TOTAL_FORMS": str(len(roles)), "memberships-INITIAL_FORMS": str(len(roles)),
        "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000",
        "cluster_accounts-TOTAL_FORMS": "0", "cluster_accounts-INITIAL_FORMS": "0",
        "cluster_accounts-MIN_NUM_FORMS": "0", "cluster_accounts-MAX_NUM_FORMS": "1000",
    } | fields  # fmt: skip
    for i, (membership, role) in enumerate(roles.items()):
        data |= {f"memberships-{i}-{key}": value for key, value in
                 (("id", str(membership.pk)), ("tenant", str(tenant.pk)), ("role", role))}  # fmt: skip
    return data


def test_decide_page_shows_the_request_beside_the_tenants_grants(admin_client, tenant, catalog):
    QuotaGrantFactory(tenant=tenant, gpus=4, gpu_hours=100, gpu_hours_used=42, days=5)
    request = QuotaRequestFactory(tenant=tenant)
    page = admin_client.get(f"/admin/tenants/quotarequest/{request.pk}/decide/").content.decode()
    assert "Protein LM" in page
    assert "42.00 / 0.00 / 100.00" in page  # used / reserved / granted of the existing grant


def test_approving_in_part_from_the_console_creates_the_grant(
    admin_client, tenant, owner, catalog, django_capture_on_commit_callbacks
):
    request = QuotaRequestFactory(tenant=tenant)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            f"/admin/tenants/quotarequest/{request.pk}/decide/",
            {"decision": "approve", "note": "Four for now.", "gpus": 4},
        )
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.state == RequestState.PARTIALLY_APPROVED
    assert request.grant.gpus == 4
    assert mail.outbox[-1].to == [owner.email]


def test_raising_a_figure_in_the_console_shows_the_error(admin_client, tenant, catalog):
    request = QuotaRequestFactory(tenant=tenant)
    response = admin_client.post(
        f"/admin/tenants/quotarequest/{request.pk}/decide/", {"decision": "approve", "note": "x", "gpus": 80}
    )
    assert response.status_code == 200
    assert "not raise it" in response.content.decode()
    assert not QuotaGrant.objects.exists()


def test_bulk_reject_asks_for_a_note_then_decides_each(admin_client, tenant, catalog):
    pending = [QuotaRequestFactory(tenant=tenant), QuotaRequestFactory(tenant=tenant)]
    decided = QuotaRequestFactory(tenant=tenant, state=RequestState.WITHDRAWN)
    ids = [str(r.pk) for r in [*pending, decided]]
    url = "/admin/tenants/quotarequest/"
    form = admin_client.post(url, {"action": "reject_selected", "_selected_action": ids})
    assert form.status_code == 200 and 'name="note"' in form.content.decode()
    done = admin_client.post(url, {"action": "reject_selected", "_selected_action": ids, "note": "Budget closed."},
                             follow=True)  # fmt: skip
    assert "2 decided, 1 skipped" in done.content.decode()
    assert {r.state for r in QuotaRequest.objects.filter(pk__in=[p.pk for p in pending])} == {
        RequestState.REJECTED
    }
    assert QuotaRequest.objects.get(pk=decided.pk).state == RequestState.WITHDRAWN


def test_member_inline_goes_through_the_services(admin_client, tenant, owner):
    newbie = UserFactory(username="newbie")
    data = change_form(tenant, {Membership.objects.get(user=owner): "owner"}, tier="high") | {
        "memberships-TOTAL_FORMS": "2", "memberships-1-id": "", "memberships-1-tenant": str(tenant.pk),
        "memberships-1-user": str(newbie.pk), "memberships-1-role": "manager",
    }  # fmt: skip
    response = admin_client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert tenant_perms(user=newbie, tenant=tenant) == ROLE_PERMISSIONS[Role.MANAGER]
    assert Tenant.objects.get(pk=tenant.pk).tier == "high"
    assert AuditEvent.objects.filter(action="tenant.tier").exists()


def test_the_console_keeps_the_last_owner(admin_client, tenant, owner):
    owner_row = Membership.objects.get(user=owner)
    response = admin_client.post(
        f"/admin/tenants/tenant/{tenant.pk}/change/", change_form(tenant, {owner_row: "viewer"})
    )
    assert response.status_code == 200
    assert "keeps at least one owner" in response.content.decode()
    assert Membership.objects.get(pk=owner_row.pk).role == Role.OWNER


def test_audit_log_is_read_only(admin_client):
    assert admin_client.get("/admin/core/auditevent/").status_code == 200
    assert admin_client.get("/admin/core/auditevent/add/").status_code == 403


def test_the_console_hands_a_tenant_from_one_owner_to_another_in_one_save(admin_client, tenant, owner):
    heir = join(tenant, "heir", Role.MEMBER)
    rows = {m.user.username: m for m in Membership.objects.filter(tenant=tenant)}
    data = change_form(tenant, {rows["owner"]: "manager", rows["heir"]: "owner"})
    response = admin_client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", data)
    assert response.status_code == 302
    assert Membership.objects.get(user=heir).role == Role.OWNER
    assert Membership.objects.get(user=owner).role == Role.MANAGER
