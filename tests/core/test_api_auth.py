"""POST /api/v1/auth/token/, GET /api/v1/auth/tokens/, DELETE /api/v1/auth/tokens/{id}/, GET /me/."""

import pytest
from django.test import override_settings

from portal.core.models import ApiToken, AuditEvent
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def test_token_is_shown_once_and_stored_hashed(anon_client, member):
    response = anon_client.post(
        "/api/v1/auth/token/", {"username": "member", "password": PASSWORD, "name": "laptop"}
    )
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"id", "name", "token", "scope", "created", "expires"}
    assert body["scope"] == "submit"
    assert body["name"] == "laptop"
    stored = ApiToken.objects.get(pk=body["id"])
    assert body["token"] not in stored.key_digest
    assert len(stored.key_digest) == 64
    assert AuditEvent.objects.filter(action="token.create", target_id=body["id"]).exists()

    listed = anon_client.get("/api/v1/auth/tokens/", HTTP_AUTHORIZATION=f"Token {body['token']}").json()
    assert [t["id"] for t in listed["results"]] == [body["id"]]
    assert "token" not in listed["results"][0]
    assert listed["results"][0]["last_used"] is not None


@pytest.mark.parametrize("username", ["member", "nobody"])
def test_wrong_credentials_answer_400_naming_the_field(anon_client, member, username):
    response = anon_client.post("/api/v1/auth/token/", {"username": username, "password": "wrong"})
    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["code"] == "invalid"
    assert body["errors"] == {"password": ["Unable to log in with these credentials."]}


def test_missing_fields_are_named(anon_client, db):
    body = anon_client.post("/api/v1/auth/token/", {}).json()
    assert body["status"] == 400
    assert set(body["errors"]) == {"username", "password"}
    assert "password" in body["detail"] and "username" in body["detail"]


def test_inactive_user_gets_no_token_and_loses_existing_ones(anon_client, client_for, member):
    client = client_for(member)
    member.is_active = False
    member.save()
    assert client.get("/api/v1/me/").status_code == 401
    assert (
        anon_client.post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD}).status_code
        == 400
    )


def test_revoked_token_stops_working(client_for, member):
    client = client_for(member)
    token_id = client.get("/api/v1/auth/tokens/").json()["results"][0]["id"]
    assert client.delete(f"/api/v1/auth/tokens/{token_id}/").status_code == 204
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_another_users_token_is_not_found(client_for, member, outsider):
    theirs = client_for(outsider).get("/api/v1/auth/tokens/").json()["results"][0]["id"]
    mine = client_for(member)
    response = mine.delete(f"/api/v1/auth/tokens/{theirs}/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert ApiToken.objects.filter(pk=theirs).exists()
    assert theirs not in [t["id"] for t in mine.get("/api/v1/auth/tokens/").json()["results"]]


@pytest.mark.parametrize("header", ["Token", "Token a b", "Token wrong-key", "Token ключ"])
def test_bad_token_headers_answer_401_with_the_scheme(anon_client, db, header):
    response = anon_client.get("/api/v1/me/", HTTP_AUTHORIZATION=header.encode().decode("latin-1"))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["code"] == "not_authenticated"


def test_me_lists_the_callers_tenants_and_roles(client_for, owner, outsider):
    body = client_for(owner).get("/api/v1/me/").json()
    assert body == {
        "username": "owner",
        "email": "owner@example.org",
        "is_staff": False,
        "platform_admin": False,
        "staff_roles": [],
        "tenants": [{"slug": "protein-lab", "name": "Protein Lab", "role": "owner"}],
    }


def test_me_costs_a_fixed_number_of_queries(client_for, owner, django_assert_max_num_queries):
    from tests.factories import MembershipFactory

    client = client_for(owner)
    client.get("/api/v1/me/")  # last_used is written on the first use
    with django_assert_max_num_queries(2):
        assert len(client.get("/api/v1/me/").json()["tenants"]) == 1
    MembershipFactory.create_batch(19, user=owner)
    with django_assert_max_num_queries(2):
        assert len(client.get("/api/v1/me/").json()["tenants"]) == 20


def test_session_login_works_for_the_browser(member, client):
    assert client.post("/accounts/login/", {"username": "member", "password": PASSWORD}).status_code == 302
    assert client.get("/api/v1/me/").json()["username"] == "member"
    # The browser's session needs CSRF on writes, unlike a token.
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(member)
    response = strict.post(
        "/api/v1/auth/token/", {"username": "member", "password": PASSWORD}, content_type="application/json"
    )
    assert response.status_code == 201  # the token endpoint takes credentials, not the session
    assert strict.delete(f"/api/v1/auth/tokens/{response.json()['id']}/").status_code == 403


def test_x_forwarded_for_does_not_reset_the_password_throttle(anon_client, member):
    with override_settings(API_THROTTLE_RATES={"user": "100/min", "anon": "100/min", "token": "3/min"}):
        codes = [
            anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "x"},
                             HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").status_code
            for i in range(5)
        ]  # fmt: skip
    assert codes == [400, 400, 400, 429, 429]


def test_me_answers_what_its_schema_serializer_would(client_for, member, tenant, other_tenant, admin_user):
    """GET /me/ builds its answer directly (tenants.api.Me); it must equal MeOut's walk."""
    from tenants.models import Membership, Role
    from tenants.selectors import membership_rows_of
    from tenants.serializers import MeOut

    Membership.objects.create(user=member, tenant=other_tenant, role=Role.VIEWER)
    for user, admin in ((member, False), (admin_user, True)):
        answer = client_for(user).get("/api/v1/me/").json()
        expected = MeOut(
            {
                "username": user.username,
                "email": user.email,
                "is_staff": user.is_staff,
                "platform_admin": admin,
                "staff_roles": [],
                "tenants": membership_rows_of(user=user),
            }
        ).data
        assert answer == expected
    assert [t["slug"] for t in client_for(member).get("/api/v1/me/").json()["tenants"]] == [
        "other-team",
        "protein-lab",
    ]
