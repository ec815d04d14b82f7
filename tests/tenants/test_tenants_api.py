"""/api/v1/tenants/ and /api/v1/tenants/{slug}/members/: roles, guardian permissions, last owner."""

import pytest

from portal.core.errors import NotFound
from portal.core.models import AuditEvent
from tenants.models import Membership, Role, Tenant
from tenants.roles import ROLE_PERMISSIONS
from tenants.selectors import tenant_perms
from tenants.services import membership_change_role, membership_remove
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_a_user_lists_only_their_tenants_and_admins_all(client_for, owner, outsider, admin_user):
    assert [t["slug"] for t in client_for(owner).get("/api/v1/tenants/").json()["results"]] == ["protein-lab"]
    every = client_for(admin_user).get("/api/v1/tenants/").json()["results"]
    assert sorted(t["slug"] for t in every) == ["other-team", "protein-lab"]


def test_admin_creates_a_tenant_with_its_owner(client_for, admin_user):
    alice = UserFactory(username="alice")
    body = {
        "slug": "climate",
        "name": "Climate",
        "tier": "high",
        "contact_email": "c@example.org",
        "owner": "alice",
    }
    response = client_for(admin_user).post("/api/v1/tenants/", body)
    assert response.status_code == 201
    assert response.json()["tier"] == "high" and response.json()["state"] == "active"
    tenant = Tenant.objects.get(slug="climate")
    assert tenant_perms(user=alice, tenant=tenant) == ROLE_PERMISSIONS[Role.OWNER]
    assert client_for(admin_user).post("/api/v1/tenants/", body).status_code == 400  # slug taken


def test_only_admins_create_tenants(client_for, owner):
    response = client_for(owner).post("/api/v1/tenants/", {"slug": "mine", "name": "Mine"})
    assert response.status_code == 403


def test_owner_renames_but_only_admins_change_tier_and_state(client_for, owner, manager, admin_user):
    assert (
        client_for(owner).patch("/api/v1/tenants/protein-lab/", {"name": "Proteins"}).json()["name"]
        == "Proteins"
    )
    assert client_for(manager).patch("/api/v1/tenants/protein-lab/", {"name": "Mine"}).status_code == 403
    assert client_for(owner).patch("/api/v1/tenants/protein-lab/", {"tier": "critical"}).status_code == 403
    response = client_for(admin_user).patch(
        "/api/v1/tenants/protein-lab/", {"tier": "critical", "state": "suspended"}
    )
    assert response.json()["tier"] == "critical" and response.json()["state"] == "suspended"
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"tenant.update", "tenant.tier", "tenant.state"} <= actions


def test_roles_become_guardian_permissions_and_follow_role_changes(client_for, owner, tenant):
    carol = UserFactory(username="carol")
    client = client_for(owner)
    assert (
        client.post(
            "/api/v1/tenants/protein-lab/members/", {"username": "carol", "role": "viewer"}
        ).status_code
        == 201
    )
    assert tenant_perms(user=carol, tenant=tenant) == ROLE_PERMISSIONS[Role.VIEWER]
    assert carol.has_perm("tenants.view_tenant", tenant)  # guardian's own backend agrees
    assert not carol.has_perm("tenants.submit_job", tenant)
    assert (
        client.patch("/api/v1/tenants/protein-lab/members/carol/", {"role": "manager"}).json()["role"]
        == "manager"
    )
    assert tenant_perms(user=carol, tenant=tenant) == ROLE_PERMISSIONS[Role.MANAGER]
    assert client.delete("/api/v1/tenants/protein-lab/members/carol/").status_code == 204
    assert tenant_perms(user=carol, tenant=tenant) == frozenset()
    assert [e.action for e in AuditEvent.objects.filter(action__startswith="membership.").order_by("id")][
        -3:
    ] == [
        "membership.add",
        "membership.role",
        "membership.remove",
    ]


def test_adding_twice_is_a_conflict_and_unknown_user_is_named(client_for, owner, member):
    client = client_for(owner)
    twice = client.post("/api/v1/tenants/protein-lab/members/", {"username": "member", "role": "viewer"})
    assert twice.status_code == 409
    unknown = client.post("/api/v1/tenants/protein-lab/members/", {"username": "nobody", "role": "viewer"})
    assert unknown.status_code == 400 and list(unknown.json()["errors"]) == ["username"]


def test_the_last_owner_can_be_neither_removed_nor_demoted(client_for, owner, admin_user):
    admin = client_for(admin_user)
    demote = admin.patch("/api/v1/tenants/protein-lab/members/owner/", {"role": "manager"})
    assert demote.status_code == 409 and demote.json()["code"] == "last_owner"
    leave = client_for(owner).delete("/api/v1/tenants/protein-lab/members/owner/")
    assert leave.status_code == 409 and leave.json()["code"] == "last_owner"
    admin.post("/api/v1/tenants/protein-lab/members/", {"username": "admin", "role": "owner"})
    assert client_for(owner).delete("/api/v1/tenants/protein-lab/members/owner/").status_code == 204


def test_managers_manage_members_but_not_owners(client_for, owner, manager, member):
    client = client_for(manager)
    assert client.patch("/api/v1/tenants/protein-lab/members/member/", {"role": "viewer"}).status_code == 200
    assert client.patch("/api/v1/tenants/protein-lab/members/member/", {"role": "owner"}).status_code == 403
    assert client.delete("/api/v1/tenants/protein-lab/members/owner/").status_code == 403
    assert Membership.objects.get(user=owner).role == Role.OWNER


def test_a_member_may_leave_but_not_remove_others(client_for, member, viewer):
    assert client_for(member).delete("/api/v1/tenants/protein-lab/members/viewer/").status_code == 403
    assert client_for(member).delete("/api/v1/tenants/protein-lab/members/member/").status_code == 204


def test_a_member_removed_meanwhile_is_not_found(owner, member, tenant):
    """Two requests on one member: the second read the member before the first removed it."""
    stale = Membership.objects.get(tenant=tenant, user=member)
    membership_remove(actor=owner, membership=Membership.objects.get(pk=stale.pk))
    with pytest.raises(NotFound):
        membership_change_role(actor=owner, membership=stale, role=Role.VIEWER)
    with pytest.raises(NotFound):
        membership_remove(actor=owner, membership=stale)
    assert not Membership.objects.filter(tenant=tenant, user=member).exists()
