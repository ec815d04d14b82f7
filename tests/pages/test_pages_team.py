"""The team page /t/<slug>/team/: members and roles, managed through the membership services."""

import pytest

from tenants.models import Membership, Role
from tests.factories import UserFactory

URL = "/t/protein-lab/team/"


def role_of(tenant, username: str) -> str | None:
    m = Membership.objects.filter(tenant=tenant, user__username=username).first()
    return m.role if m else None


def test_the_page_lists_members_and_roles_with_controls_for_managers(web, owner, member, manager):
    page = web(manager).get(URL).content.decode()
    for name in ("owner", "member", "manager"):
        assert f'id="member-{name}"' in page
    assert 'id="add-member"' in page and f"{URL}member/remove/" in page
    assert f"{URL}owner/remove/" not in page  # only owners touch owners


def test_a_manager_adds_changes_and_removes_a_member(web, manager, tenant):
    UserFactory(username="newbie")
    client = web(manager)
    response = client.post(f"{URL}add/", {"username": "newbie", "role": "member"}, follow=True)
    assert role_of(tenant, "newbie") == Role.MEMBER
    assert "newbie joined as Member." in response.content.decode()
    response = client.post(f"{URL}newbie/role/", {"role": "viewer"}, follow=True)
    assert role_of(tenant, "newbie") == Role.VIEWER
    assert "newbie is now Viewer." in response.content.decode()
    response = client.post(f"{URL}newbie/remove/", follow=True)
    assert role_of(tenant, "newbie") is None
    assert "newbie was removed from the team." in response.content.decode()


def test_add_errors_are_named_and_a_conflict_is_shown(web, owner, member):
    client = web(owner)
    response = client.post(f"{URL}add/", {"username": "ghost", "role": "nope"})
    assert response.status_code == 400
    # The form first; whether the username names a user is asked only of a whole form (a look-up
    # that tells it is counted: tenants.permissions.member_candidate).
    assert set(response.context["form"].errors) == {"role"}
    response = client.post(f"{URL}add/", {"username": "ghost", "role": "viewer"})
    assert response.status_code == 400
    assert set(response.context["form"].errors) == {"username"}
    response = client.post(f"{URL}add/", {"username": "member", "role": "viewer"})
    assert response.status_code == 400
    assert "member is already a member of protein-lab." in response.content.decode()


def test_the_last_owner_cannot_step_down_or_leave(web, owner, tenant):
    client = web(owner)
    response = client.post(f"{URL}owner/role/", {"role": "member"}, follow=True)
    assert "A team needs at least one owner." in response.content.decode()
    assert "owner is the last owner of protein-lab." in response.content.decode()
    client.post(f"{URL}owner/remove/")
    assert role_of(tenant, "owner") == Role.OWNER


def test_a_manager_cannot_make_or_unmake_owners(web, manager, owner, member, tenant):
    client = web(manager)
    assert client.post(f"{URL}member/role/", {"role": "owner"}).status_code == 403
    assert client.post(f"{URL}owner/remove/").status_code == 403
    assert role_of(tenant, "member") == Role.MEMBER and role_of(tenant, "owner") == Role.OWNER


@pytest.mark.parametrize("persona", ["viewer", "member"])
def test_viewers_and_members_see_no_controls_and_their_posts_are_refused(
    request, web, persona, owner, tenant
):
    UserFactory(username="newbie")
    client = web(request.getfixturevalue(persona))
    page = client.get(URL).content.decode()
    assert 'id="add-member"' not in page and "/remove/" not in page
    assert client.post(f"{URL}add/", {"username": "newbie", "role": "member"}).status_code == 403
    assert client.post(f"{URL}owner/role/", {"role": "viewer"}).status_code == 403
    assert client.post(f"{URL}owner/remove/").status_code == 403
    assert role_of(tenant, "newbie") is None and role_of(tenant, "owner") == Role.OWNER


def test_another_tenants_page_is_404(web, outsider, owner):
    client = web(outsider)
    assert client.get(URL).status_code == 404
    assert client.post(f"{URL}add/", {"username": "outsider", "role": "member"}).status_code == 404
    assert client.post(f"{URL}owner/remove/").status_code == 404
