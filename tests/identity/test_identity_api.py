"""The group mapping API (docs/api.md, Group mappings): platform admins write, staff who see
every tenant read, anyone else gets 403; bad input names its field; every change audited."""

import pytest
from django.contrib.auth.models import Group

from identity.models import GroupMapping
from portal.core.models import AuditEvent
from portal.core.staff import ROLE_READ_ONLY_SUPPORT
from tests.api_support import assert_problem
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/group-mappings/"
DN = "cn=GPU-Owners, ou=groups,dc=portal,dc=test"


def _body(**overrides):
    return {"source": "ldap", "group": DN, "tenant": "protein-lab", "role": "owner", **overrides}


def test_a_platform_admin_maps_changes_and_unmaps_a_group(client_for, admin_user, tenant):
    api = client_for(admin_user)
    made = api.post(URL, _body())
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body | {"id": "", "created": ""} == {
        "id": "", "source": "ldap", "group": "cn=gpu-owners,ou=groups,dc=portal,dc=test",
        "tenant": "protein-lab", "role": "owner", "created": "",
    }  # fmt: skip
    assert api.get(URL).json()["results"] == [body]
    assert api.get(URL, {"tenant": "other-team"}).json()["results"] == []
    changed = api.patch(f"{URL}{body['id']}/", {"role": "manager"})
    assert changed.status_code == 200 and changed.json()["role"] == "manager"
    assert api.delete(f"{URL}{body['id']}/").status_code == 204
    assert not GroupMapping.objects.exists()
    actions = list(
        AuditEvent.objects.filter(action__startswith="group_mapping.").values_list("action", flat=True)
    )
    assert actions == ["group_mapping.delete", "group_mapping.role", "group_mapping.create"]


def test_bad_input_names_the_field(client_for, admin_user, tenant):
    api = client_for(admin_user)
    assert api.post(URL, _body()).status_code == 201
    body = assert_problem(api.post(URL, _body(group=DN.upper())), 400, "invalid")
    assert list(body["errors"]) == ["group"]
    for field, value in (("source", "saml"), ("tenant", "no-such-team"), ("role", "god"), ("group", "")):
        body = assert_problem(api.post(URL, _body(**{field: value})), 400, "invalid")
        assert list(body["errors"]) == [field], field
    assert GroupMapping.objects.count() == 1


def test_members_and_owners_may_neither_read_nor_write(client_for, owner, tenant):
    api = client_for(owner)
    assert_problem(api.get(URL), 403, "permission_denied")
    assert_problem(api.post(URL, _body()), 403, "permission_denied")
    assert not GroupMapping.objects.exists()


def test_read_only_support_reads_and_may_not_write(client_for, admin_user, tenant):
    mapping = client_for(admin_user).post(URL, _body()).json()
    support = UserFactory(username="support", is_staff=True)
    support.groups.add(Group.objects.get(name=ROLE_READ_ONLY_SUPPORT))
    api = client_for(support)
    assert [m["id"] for m in api.get(URL).json()["results"]] == [mapping["id"]]
    assert_problem(api.patch(f"{URL}{mapping['id']}/", {"role": "viewer"}), 403, "permission_denied")
    assert_problem(api.delete(f"{URL}{mapping['id']}/"), 403, "permission_denied")
    assert GroupMapping.objects.get().role == "owner"


def test_an_unknown_mapping_is_404(client_for, admin_user):
    assert_problem(client_for(admin_user).get(f"{URL}999/"), 404, "not_found")


def test_the_console_maps_changes_and_unmaps_a_group_through_the_services(client, admin_user, tenant):
    client.force_login(admin_user)
    add = "/admin/identity/groupmapping/add/"
    response = client.post(
        add, {"source": "oidc", "group": "climate-lab", "tenant": tenant.pk, "role": "viewer"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    mapping = GroupMapping.objects.get()
    assert (mapping.group, mapping.role) == ("climate-lab", "viewer")
    dn = {"source": "ldap", "tenant": tenant.pk, "role": "owner"}
    assert client.post(add, {**dn, "group": "cn=Lab,dc=portal,dc=test"}).status_code == 302
    again = client.post(add, {**dn, "group": "CN=lab, DC=portal,dc=test"})  # the same DN
    assert again.status_code == 200 and "already exists" in again.content.decode()
    GroupMapping.objects.filter(source="ldap").delete()
    change = f"/admin/identity/groupmapping/{mapping.pk}/change/"
    assert client.post(change, {"role": "member"}).status_code == 302
    assert GroupMapping.objects.get().role == "member"
    assert (
        client.post(f"/admin/identity/groupmapping/{mapping.pk}/delete/", {"post": "yes"}).status_code == 302
    )
    assert not GroupMapping.objects.exists()
    audited = AuditEvent.objects.filter(action__startswith="group_mapping.", data__source="oidc")
    actions = list(audited.values_list("action", "actor"))
    assert actions == [(f"group_mapping.{a}", admin_user.pk) for a in ("delete", "role", "create")]
