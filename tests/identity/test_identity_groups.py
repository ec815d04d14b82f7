"""Directory groups followed into tenant roles (identity.services): gained, changed and lost as
the groups say, memberships made by hand untouched, the highest mapped role wins, the last
owner kept with the conflict audited and mailed, a gone user's sessions and tokens ended."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from identity.models import DirectoryAccount, GroupMapping, Source
from identity.services import (
    DirectoryRefused,
    directory_signed_in,
    directory_user_gone,
    directory_user_new,
    groups_follow,
)
from portal.core.models import ApiToken, AuditEvent
from portal.core.tokens import token_create
from tenants.models import Membership, Profile, Role
from tenants.selectors import tenant_perms
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

OWNERS = "cn=gpu-protein-owners,ou=groups,dc=portal,dc=test"
MEMBERS = "cn=gpu-protein-members,ou=groups,dc=portal,dc=test"


@pytest.fixture
def mapped(tenant, other_tenant):
    GroupMapping.objects.create(source=Source.LDAP, group=OWNERS, tenant=tenant, role=Role.OWNER)
    GroupMapping.objects.create(source=Source.LDAP, group=MEMBERS, tenant=tenant, role=Role.MEMBER)
    GroupMapping.objects.create(source=Source.OIDC, group="climate", tenant=other_tenant, role=Role.VIEWER)


def _signed_in(username: str, groups: list[str], source=Source.LDAP, **kwargs):
    user = directory_user_new(username=username, email="", first_name="", last_name="", source=source,
                              subject=f"uid={username},ou=people,dc=portal,dc=test")  # fmt: skip
    conflicts = directory_signed_in(
        user=user, source=source, subject=user.directory.subject, groups=groups, **kwargs
    )
    return user, conflicts


def _role(user, tenant):
    return Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()


def test_groups_give_roles_and_the_highest_wins(mapped, tenant, other_tenant):
    user, conflicts = _signed_in("alice", [MEMBERS.upper(), "cn=unmapped,dc=portal,dc=test", OWNERS])
    assert conflicts == []
    membership = Membership.objects.get(user=user, tenant=tenant)
    assert (membership.role, membership.managed) == (Role.OWNER, True)
    assert "manage_members" in tenant_perms(user=user, tenant=tenant)
    assert _role(user, other_tenant) is None  # an OIDC mapping says nothing of LDAP groups
    event = AuditEvent.objects.get(action="membership.add", tenant_id=tenant.pk)
    assert event.actor is None and event.data["cause"] == f"sign-in: group {OWNERS}"


def test_a_user_moved_between_groups_changes_role_and_one_removed_loses_it(mapped, tenant, owner):
    user, _ = _signed_in("bob", [MEMBERS])
    assert _role(user, tenant) == Role.MEMBER
    groups_follow(user=user, source=Source.LDAP, groups=[OWNERS], cause="sync")
    assert _role(user, tenant) == Role.OWNER
    groups_follow(user=user, source=Source.LDAP, groups=[], cause="sync")
    assert _role(user, tenant) is None
    assert tenant_perms(user=user, tenant=tenant) == frozenset()
    actions = list(
        AuditEvent.objects.filter(tenant_id=tenant.pk, data__username="bob").values_list(
            "action", "data__cause"
        )
    )
    assert actions == [
        ("membership.remove", "sync: in no mapped group"),
        ("membership.role", f"sync: group {OWNERS}"),
        ("membership.add", f"sign-in: group {MEMBERS}"),
    ]


def test_memberships_made_by_hand_stay_as_they_are(mapped, tenant, manager):
    DirectoryAccount.objects.create(user=manager, source=Source.LDAP, subject="uid=manager,dc=portal,dc=test")
    groups_follow(user=manager, source=Source.LDAP, groups=[MEMBERS], cause="sync")
    assert _role(manager, tenant) == Role.MANAGER
    groups_follow(user=manager, source=Source.LDAP, groups=[], cause="sync")
    assert _role(manager, tenant) == Role.MANAGER


def test_a_tenant_no_mapping_names_keeps_memberships(tenant, other_tenant):
    GroupMapping.objects.create(source=Source.LDAP, group=MEMBERS, tenant=tenant, role=Role.MEMBER)
    user, _ = _signed_in("carol", [MEMBERS])
    GroupMapping.objects.all().delete()
    groups_follow(user=user, source=Source.LDAP, groups=[], cause="sync")
    assert _role(user, tenant) == Role.MEMBER


def test_the_last_owner_stays_and_the_conflict_reaches_platform_admins(
    mapped, tenant, admin_user, mailoutbox, django_capture_on_commit_callbacks
):
    admin_user.email = "root@example.org"
    admin_user.save()
    user, _ = _signed_in("alice", [OWNERS])
    assert list(
        Membership.objects.filter(tenant=tenant, role=Role.OWNER).values_list("user__username", flat=True)
    ) == ["alice"]
    with django_capture_on_commit_callbacks(execute=True):
        conflicts = groups_follow(user=user, source=Source.LDAP, groups=[MEMBERS], cause="sync")
        conflicts += groups_follow(user=user, source=Source.LDAP, groups=[], cause="sync")
    assert [(c.tenant, c.wanted, c.held) for c in conflicts] == [
        ("protein-lab", "member", "owner"),
        ("protein-lab", "", "owner"),
    ]
    assert _role(user, tenant) == Role.OWNER
    assert AuditEvent.objects.filter(action="membership.sync_conflict", tenant_id=tenant.pk).count() == 2
    assert [m.to for m in mailoutbox] == [["root@example.org"], ["root@example.org"]]
    assert "without an owner" in mailoutbox[0].subject


def test_the_cluster_username_comes_from_the_directory_when_valid_and_free(mapped):
    alice, _ = _signed_in("alice", [], cluster_username="alice")
    assert Profile.objects.get(user=alice).cluster_username == "alice"
    mallory, _ = _signed_in("mallory", [], cluster_username="alice")  # someone else's
    assert not Profile.objects.filter(user=mallory).exclude(cluster_username="").exists()
    eve, _ = _signed_in("eve", [], cluster_username="root; rm -rf /")
    assert not Profile.objects.filter(user=eve).exclude(cluster_username="").exists()


def test_a_local_account_is_never_taken_over(member):
    with pytest.raises(DirectoryRefused, match="exists and is not linked"):
        directory_user_new(
            username="member", email="", first_name="", last_name="", source=Source.OIDC, subject="x"
        )
    assert not DirectoryAccount.objects.exists()


def test_a_user_the_directory_removed_loses_sessions_and_tokens_and_comes_back_by_signing_in(mapped, tenant):
    user, _ = _signed_in("bob", [MEMBERS])
    browser = Client()
    browser.force_login(user, backend="django.contrib.auth.backends.ModelBackend")
    assert browser.get("/api/v1/me/").status_code == 200
    _, key = token_create(user=user, name="laptop")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    directory_user_gone(user=user, cause="sync: not in the directory")
    assert browser.get("/api/v1/me/").status_code in (401, 403)
    assert api.get("/api/v1/me/").status_code == 401
    assert ApiToken.objects.filter(user=user).exists()  # kept, for a false alarm
    user.refresh_from_db()
    assert not user.is_active and _role(user, tenant) == Role.MEMBER  # kept for the record
    directory_signed_in(user=user, source=Source.LDAP, subject=user.directory.subject, groups=[MEMBERS])
    user.refresh_from_db()
    assert user.is_active
    assert AuditEvent.objects.filter(action="user.enable", target_id=str(user.pk)).exists()
    assert api.get("/api/v1/me/").status_code == 200


def test_a_user_a_platform_admin_disabled_is_not_brought_back_by_the_directory():
    user = UserFactory(username="dora", is_active=False)
    DirectoryAccount.objects.create(user=user, source=Source.LDAP, subject="uid=dora,dc=portal,dc=test")
    directory_signed_in(user=user, source=Source.LDAP, subject="uid=dora,dc=portal,dc=test", groups=[])
    assert not get_user_model().objects.get(pk=user.pk).is_active


def test_another_subject_behind_a_known_username_is_refused(mapped):
    user, _ = _signed_in("tom", [MEMBERS])
    with pytest.raises(DirectoryRefused, match="another identity"):
        directory_signed_in(user=user, source=Source.LDAP, subject="uid=tom,ou=elsewhere", groups=[OWNERS])
    assert DirectoryAccount.objects.get(user=user).subject == "uid=tom,ou=people,dc=portal,dc=test"


def test_a_standing_conflict_is_reported_once_a_day_not_at_every_sync(
    mapped, tenant, admin_user, mailoutbox, django_capture_on_commit_callbacks
):
    admin_user.email = "root@example.org"
    admin_user.save()
    user, _ = _signed_in("alice", [OWNERS])
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(3):
            assert len(groups_follow(user=user, source=Source.LDAP, groups=[MEMBERS], cause="sync")) == 1
    assert AuditEvent.objects.filter(action="membership.sync_conflict").count() == 1
    assert len(mailoutbox) == 1


def test_a_name_the_portal_cannot_take_is_refused_with_the_reason():
    with pytest.raises(DirectoryRefused, match="cannot be a portal username"):
        directory_user_new(
            username="o'brien", email="", first_name="", last_name="", source=Source.OIDC, subject="s"
        )
    with pytest.raises(DirectoryRefused, match="exists and is not linked"):
        UserFactory(username="bob")
        directory_user_new(
            username="BOB", email="", first_name="", last_name="", source=Source.OIDC, subject="s"
        )
    assert not DirectoryAccount.objects.exists()
