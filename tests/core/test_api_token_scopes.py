"""Tokens' scopes and expiries (docs/api.md, Tokens): a `read` token only reads, staff powers
need an `admin` token that only staff may hold, an expired token answers 401 `token_expired`,
and tokens made before scopes existed became `submit` with the site's maximum expiry."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from portal.core.models import ApiToken, AuditEvent
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db

TOKEN_URL = "/api/v1/auth/token/"


def _token(anon_client, username, **fields):
    response = anon_client.post(TOKEN_URL, {"username": username, "password": PASSWORD, **fields})
    assert response.status_code == 201, response.json()
    return response.json()


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_new_token_expires_after_the_default_days_and_says_its_scope(anon_client, member):
    before = timezone.now()
    body = _token(anon_client, "member", name="laptop")
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.scope == body["scope"] == "submit"
    assert timedelta(days=90) <= stored.expires - before <= timedelta(days=90, minutes=1)
    listed = _client(body["token"]).get("/api/v1/auth/tokens/").json()["results"][0]
    assert listed["scope"] == "submit" and listed["expires"] == body["expires"]
    assert AuditEvent.objects.get(action="token.create", target_id=body["id"]).data == {
        "name": "laptop",
        "scope": "submit",
        "days": 90,
    }


def test_a_token_may_ask_for_fewer_days_but_never_more_than_the_site_maximum(anon_client, member):
    body = _token(anon_client, "member", expires_in_days=7)
    assert ApiToken.objects.get(pk=body["id"]).expires - timezone.now() < timedelta(days=7, minutes=1)
    with override_settings(API_TOKEN_MAX_DAYS=30):
        response = anon_client.post(
            TOKEN_URL, {"username": "member", "password": PASSWORD, "expires_in_days": 31}
        )
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"expires_in_days"}
    for bad in (0, -1, "soon", 1.5):
        response = anon_client.post(
            TOKEN_URL, {"username": "member", "password": PASSWORD, "expires_in_days": bad}
        )
        assert response.status_code == 400 and set(response.json()["errors"]) == {"expires_in_days"}, bad


def test_an_expired_token_answers_401_token_expired(anon_client, member):
    body = _token(anon_client, "member")
    client = _client(body["token"])
    assert client.get("/api/v1/me/").status_code == 200
    ApiToken.objects.filter(pk=body["id"]).update(expires=timezone.now() - timedelta(seconds=1))
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    problem = response.json()
    assert problem["code"] == "token_expired" and "expired" in problem["detail"]


def test_a_read_token_reads_and_may_not_write(anon_client, member, tenant, grant):
    client = _client(_token(anon_client, "member", scope="read")["token"])
    assert client.get(f"/api/v1/jobs/?tenant={tenant.slug}").status_code == 200
    for method, path in (
        ("post", "/api/v1/jobs/"),
        ("post", "/api/v1/quota-requests/"),
        ("delete", "/api/v1/auth/tokens/1/"),
        ("patch", f"/api/v1/tenants/{tenant.slug}/"),
    ):
        response = getattr(client, method)(path, {})
        assert response.status_code == 403, (method, path)
        assert response.json()["code"] == "token_scope"
    assert not AuditEvent.objects.filter(action__startswith="job.").exists()


def test_only_staff_may_hold_an_admin_token(anon_client, member, admin_user):
    response = anon_client.post(TOKEN_URL, {"username": "member", "password": PASSWORD, "scope": "admin"})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["scope"]
    assert not ApiToken.objects.filter(user=member).exists()
    assert _token(anon_client, admin_user.username)["scope"] == "admin"  # staff's default: their widest


def test_staff_powers_need_an_admin_token(anon_client, admin_user, tenant):
    admin = _client(_token(anon_client, admin_user.username, scope="admin")["token"])
    submit = _client(_token(anon_client, admin_user.username, scope="submit")["token"])
    assert admin.get(f"/api/v1/tenants/{tenant.slug}/").status_code == 200
    assert admin.get("/api/v1/me/").json()["platform_admin"] is True
    # With a submit token the platform admin is only what their memberships make them.
    assert submit.get(f"/api/v1/tenants/{tenant.slug}/").status_code == 404
    response = submit.post("/api/v1/tenants/", {"slug": "new-team", "name": "New team"})
    assert response.status_code == 403
    assert response.json()["code"] == "token_scope"


def test_a_session_is_not_limited_by_scopes(client, admin_user, tenant):
    client.force_login(admin_user)
    assert client.get(f"/api/v1/tenants/{tenant.slug}/").status_code == 200


@pytest.mark.django_db(transaction=True)  # migrations run outside the test's transaction
def test_tokens_made_before_scopes_became_submit_with_the_site_maximum():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("core", "0001_initial")])
    old_apps = executor.loader.project_state([("core", "0001_initial")]).apps
    User = old_apps.get_model("auth", "User")
    user = User.objects.create(username="old-timer")
    old_apps.get_model("core", "ApiToken").objects.create(user=user, name="old", key_digest="0" * 64)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    token = ApiToken.objects.get(name="old")
    assert token.scope == "submit"
    assert timedelta(days=364) < token.expires - timezone.now() <= timedelta(days=365)
