"""Every route of tenants and quota, as each persona, against objects of two tenants.

Each answer is checked against the role table below: the own tenant answers by role, the other
tenant answers 404 as if its objects did not exist (or, for a slug in a body, 400 naming it)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.models import Role, Tenant
from tests.conftest import join
from tests.factories import QuotaGrantFactory, QuotaRequestFactory, UserFactory

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()
PERSONAS = ["admin", "owner", "manager", "member", "viewer"]

# action: (method, path, body, expected status for admin, owner, manager, member, viewer)
ACTIONS = {
    "get_tenant": ("get", "/api/v1/tenants/{t}/", None, (200, 200, 200, 200, 200)),
    "rename_tenant": ("patch", "/api/v1/tenants/{t}/", {"name": "New"}, (200, 200, 403, 403, 403)),
    "set_tier": ("patch", "/api/v1/tenants/{t}/", {"tier": "high"}, (200, 403, 403, 403, 403)),
    "list_members": ("get", "/api/v1/tenants/{t}/members/", None, (200, 200, 200, 200, 200)),
    "add_member": ("post", "/api/v1/tenants/{t}/members/", {"username": "newbie", "role": "member"},
                   (201, 201, 201, 403, 403)),
    "change_member": ("patch", "/api/v1/tenants/{t}/members/{t}-target/", {"role": "viewer"},
                      (200, 200, 200, 403, 403)),
    "remove_member": ("delete", "/api/v1/tenants/{t}/members/{t}-target/", None, (204, 204, 204, 403, 403)),
    "get_request": ("get", "/api/v1/quota-requests/{req}/", None, (200, 200, 200, 200, 200)),
    "create_request": ("post", "/api/v1/quota-requests/", "request", (201, 201, 201, 403, 403)),
    "withdraw_request": ("delete", "/api/v1/quota-requests/{req}/", None, (204, 204, 204, 403, 403)),
    "approve_request": ("post", "/api/v1/quota-requests/{req}/approve/", {"note": "ok"}, (200, 403, 403, 403, 403)),
    "reject_request": ("post", "/api/v1/quota-requests/{req}/reject/", {"note": "no"}, (200, 403, 403, 403, 403)),
    "get_quota": ("get", "/api/v1/quotas/{grant}/", None, (200, 200, 200, 200, 200)),
}  # fmt: skip


@pytest.fixture
def world(admin_user):
    """Two tenants, each with a member to act on, a pending request and a grant."""
    UserFactory(username="newbie")
    objects = {}
    for slug in ("team-a", "team-b"):
        tenant = Tenant.objects.create(slug=slug, name=slug)
        join(tenant, f"{slug}-target", Role.MEMBER)
        request = QuotaRequestFactory(tenant=tenant, gpus=2, gpu_hours=10, days=9, justification="j")
        grant = QuotaGrantFactory(tenant=tenant, gpus=2, gpu_hours=10, days=9)
        objects[slug] = {"t": slug, "req": request.pk, "grant": grant.pk, "tenant": tenant}
    return objects


def persona_in_team_a(name: str, world, admin_user):
    return admin_user if name == "admin" else join(world["team-a"]["tenant"], name, Role(name))


def call(client, action: str, objects: dict):
    method, path, body, _ = ACTIONS[action]
    if body == "request":
        body = {
            "tenant": objects["t"], "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 1,
            "gpu_hours": 5, "starts_on": str(TODAY), "ends_on": str(TODAY + timedelta(days=5)), "justification": "j",
        }  # fmt: skip
    return getattr(client, method)(path.format(**objects), body)


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("persona", PERSONAS)
def test_own_tenant_answers_by_role(world, admin_user, client_for, persona, action):
    client = client_for(persona_in_team_a(persona, world, admin_user))
    response = call(client, action, world["team-a"])
    assert response.status_code == ACTIONS[action][3][PERSONAS.index(persona)], response.content
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize("action", sorted(ACTIONS))
@pytest.mark.parametrize("persona", PERSONAS[1:])
def test_other_tenant_does_not_exist_for_its_outsiders(world, admin_user, client_for, persona, action):
    client = client_for(persona_in_team_a(persona, world, admin_user))
    response = call(client, action, world["team-b"])
    if action == "create_request":
        assert response.status_code == 400
        assert list(response.json()["errors"]) == ["tenant"]
    else:
        assert response.status_code == 404, response.content
        assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("persona", PERSONAS)
def test_lists_show_only_what_the_persona_may_see(world, admin_user, client_for, persona):
    client = client_for(persona_in_team_a(persona, world, admin_user))
    expected = {"team-a", "team-b"} if persona == "admin" else {"team-a"}
    assert {t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]} == expected
    assert {r["tenant"] for r in client.get("/api/v1/quota-requests/").json()["results"]} == expected
    assert {g["tenant"] for g in client.get("/api/v1/quotas/").json()["results"]} == expected
    # A filter naming the other tenant finds nothing rather than revealing it.
    filtered = client.get("/api/v1/quotas/?tenant=team-b").json()["results"]
    assert [g["tenant"] for g in filtered] == (["team-b"] if persona == "admin" else [])
    audit = {e["tenant"] for e in client.get("/api/v1/audit/?page_size=200").json()["results"]}
    may_read_audit = persona in ("admin", "owner", "manager")
    assert audit - {""} == (expected if may_read_audit else set())


CATALOG = ["/api/v1/gpu-models/", "/api/v1/scenarios/", "/api/v1/scenarios/ai-training/", "/api/v1/clusters/"]


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_catalog_is_the_same_for_every_signed_in_persona(
    world, admin_user, client_for, anon_client, persona
):
    client = client_for(persona_in_team_a(persona, world, admin_user))
    for url in CATALOG:
        assert client.get(url).status_code == 200, url
        assert anon_client.get(url).status_code == 401, url
