"""Sign-in through a real OpenID provider (panva's oidc-provider on loopback, tests/oidc_support.py):
headless Chromium signs in with PKCE, lands on the tenant its groups map to with their role,
makes an API token, signs out of the portal and the provider; a session ends when the provider
no longer knows the user; and bad answers (a forged, expired or foreign ID token, a replayed
state, a groups claim that is not a list) are refused with a message and create nothing."""

import html
import json
import re
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from playwright.sync_api import expect
from rest_framework.test import APIClient

from identity.models import DirectoryAccount, GroupMapping, Source
from identity.tasks import sync_directory
from portal.core.models import ApiToken
from portal.core.tokens import token_create
from tenants.models import Membership, Profile, Role
from tests.browser import browser_page, outside_the_browser, screenshot
from tests.conftest import free_port
from tests.http_support import loopback_server
from tests.identity_support import oidc_on
from tests.oidc_support import oidc_provider, sign_jwt

User = get_user_model()
OWNERS = "gpu-protein-owners"
VIEWERS = "gpu-protein-viewers"


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    with oidc_provider(
        tmp_path_factory.mktemp("oidc"),
        redirect_uri=f"{live_server.url}/accounts/oidc/callback/",
        post_logout_redirect_uri=f"{live_server.url}/accounts/login/",
        client_name="Campus SSO",
    ) as running:
        running.set_user("olivia", "olivia-secret-1", sub="sub-olivia", preferred_username="olivia",
                         email="olivia@uni.example", given_name="Olivia", family_name="Ng",
                         groups=[OWNERS, "library-staff"], uid="ong42")  # fmt: skip
        yield running


@pytest.fixture
def mapped(tenant):
    GroupMapping.objects.create(source=Source.OIDC, group=OWNERS, tenant=tenant, role=Role.OWNER)
    GroupMapping.objects.create(source=Source.OIDC, group=VIEWERS, tenant=tenant, role=Role.VIEWER)


def _sign_in_at_provider(page, login: str, password: str) -> None:
    page.get_by_label("login", exact=False).first.fill(login)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_a_researcher_signs_in_through_the_provider_lands_on_their_tenant_and_signs_out(
    live_server, provider, mapped, tenant
):
    base = live_server.url
    with oidc_on(provider), browser_page() as page:
        page.goto(f"{base}/accounts/login/")
        screenshot(page, "login-sso-en")
        page.get_by_role("link", name="Sign in with Campus SSO").click()
        page.wait_for_url(f"{provider.issuer}/**")
        _sign_in_at_provider(page, "olivia", "olivia-secret-1")
        page.wait_for_url(f"{base}/t/protein-lab/")
        expect(page.locator(".role-badge")).to_have_text("Owner")

        # A token for the API, made on the page by someone with no portal password.
        page.goto(f"{base}/account/tokens/")
        page.get_by_label("Name").fill("laptop")
        page.get_by_role("button", name="Create token").click()
        key = page.locator("#new-token-key").inner_text().strip()

        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(f"{base}/accounts/login/**")
        # The provider's session ended too: signing in again asks for the password.
        page.get_by_role("link", name="Sign in with Campus SSO").click()
        page.wait_for_url(f"{provider.issuer}/**")
        expect(page.locator("input[name=password]")).to_be_visible()
    with oidc_on(provider):  # logged out, not gone: the offline refresh token outlives the session
        assert sync_directory() == {"synced": 1, "gone": 0, "failed": 0, "held": 0}

    user = User.objects.get(username="olivia")
    assert not user.has_usable_password()
    assert (user.email, user.first_name, user.last_name) == ("olivia@uni.example", "Olivia", "Ng")
    assert DirectoryAccount.objects.get(user=user).subject == "sub-olivia"
    assert DirectoryAccount.objects.get(user=user).groups == sorted([OWNERS, "library-staff"])
    assert Profile.objects.get(user=user).cluster_username == "ong42"
    assert Membership.objects.get(user=user, tenant=tenant).role == Role.OWNER
    assert ApiToken.objects.get(user=user).scope == "submit" and len(key) == 43


def test_the_login_page_offers_the_provider_in_chinese(live_server, provider):
    with oidc_on(provider, name="校园统一认证"), browser_page(locale="zh-CN") as page:
        page.goto(f"{live_server.url}/accounts/login/")
        expect(page.get_by_role("link", name="使用校园统一认证登录")).to_be_visible()
        expect(page.get_by_text("或使用用户名和密码")).to_be_visible()
        screenshot(page, "login-sso-zh-hans")


def test_a_session_ends_when_the_provider_no_longer_knows_the_user(live_server, provider, mapped):
    provider.set_user("pat", "pat-secret-1", sub="sub-pat", preferred_username="pat", groups=[VIEWERS])
    base = live_server.url
    with oidc_on(provider, OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS=2), browser_page() as page:
        page.goto(f"{base}/accounts/oidc/login/")
        _sign_in_at_provider(page, "pat", "pat-secret-1")
        page.wait_for_url(f"{base}/t/protein-lab/")
        expect(page.locator(".role-badge")).to_have_text("Viewer")
        provider.remove_user("pat")
        time.sleep(2.5)  # past OIDC_RENEW_SECONDS: the next page asks the provider (prompt=none)
        page.goto(f"{base}/t/protein-lab/jobs/")
        page.wait_for_url(f"{base}/accounts/oidc/callback/**")
        expect(page.locator("#sso-error")).to_contain_text("single sign-on session has ended")
        page.goto(f"{base}/t/protein-lab/")
        page.wait_for_url(f"{base}/accounts/login/**")  # signed out of the portal


def test_the_sync_follows_the_providers_groups_and_ends_a_user_it_refuses(
    live_server, provider, mapped, tenant
):
    quinn = {"sub": "sub-quinn", "preferred_username": "quinn"}
    provider.set_user("quinn", "quinn-secret-1", **quinn, groups=[VIEWERS])
    base = live_server.url

    def stored_refresh_token() -> tuple[str, str]:
        """The token as the portal reads it, and the column as the database holds it."""
        user = User.objects.get(username="quinn")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT refresh_token FROM identity_directoryaccount WHERE user_id = %s", [user.pk]
            )
            return user.directory.refresh_token, cursor.fetchone()[0]

    def sync_as_the_provider_says(**change) -> dict:
        if change:
            provider.set_user("quinn", "quinn-secret-1", **quinn, **change)
        else:
            provider.remove_user("quinn")
        return sync_directory()

    with oidc_on(provider), browser_page() as page:
        page.goto(f"{base}/accounts/oidc/login/")
        _sign_in_at_provider(page, "quinn", "quinn-secret-1")
        page.wait_for_url(f"{base}/t/protein-lab/")
        expect(page.locator(".role-badge")).to_have_text("Viewer")
        token, column = outside_the_browser(stored_refresh_token)
        assert token and token not in column  # encrypted at rest
        key = outside_the_browser(
            lambda: token_create(user=User.objects.get(username="quinn"), name="cli")[1]
        )
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {key}")

        assert outside_the_browser(sync_as_the_provider_says, groups=[OWNERS]) == {
            "synced": 1,
            "gone": 0,
            "failed": 0,
            "held": 0,
        }
        role = outside_the_browser(lambda: Membership.objects.get(user__username="quinn", tenant=tenant).role)
        assert role == Role.OWNER
        assert outside_the_browser(sync_as_the_provider_says) == {
            "synced": 0,
            "gone": 1,
            "failed": 0,
            "held": 0,
        }
        assert outside_the_browser(lambda: api.get("/api/v1/me/").status_code) == 401
        page.goto(f"{base}/t/protein-lab/")
        page.wait_for_url(f"{base}/accounts/login/**")  # the browser's session ended too


def test_an_unreachable_provider_disables_no_one(provider, mapped):
    first, _ = _callback_with(
        provider, lambda nonce: sign_jwt(_claims(provider, nonce), provider.private_key, provider.kid)
    )
    assert first.status_code == 302
    DirectoryAccount.objects.filter(user__username="mallory").update(refresh_token="rt")
    with oidc_on(provider, OIDC_OP_TOKEN_ENDPOINT=f"http://127.0.0.1:{free_port()}/token"):
        assert sync_directory() == {"synced": 0, "gone": 0, "failed": 1, "held": 0}
    assert User.objects.get(username="mallory").is_active


# --- Bad answers. The provider's JWKS is real; the token and userinfo endpoints are a loopback
# server that answers what a compromised or confused provider would.


def _claims(provider, nonce: str, **overrides) -> dict:
    now = int(time.time())
    return {
        "iss": provider.issuer, "aud": provider.client_id, "sub": "sub-mallory", "iat": now, "exp": now + 300,
        "nonce": nonce, "preferred_username": "mallory", "groups": [OWNERS], **overrides,
    }  # fmt: skip


def _callback_with(provider, make_token, *, userinfo=None, replay: bool = False):
    """Start a sign-in with Django's client, then answer its code exchange with `make_token(nonce)`."""
    client = Client()
    started: dict[str, str] = {}

    def answer(request):
        if request.path == "/token":
            body = {"id_token": make_token(started["nonce"]), "access_token": "at", "token_type": "Bearer"}
            return 200, "application/json", json.dumps(body).encode()
        info = userinfo or {"sub": "sub-mallory", "preferred_username": "mallory", "groups": [OWNERS]}
        return 200, "application/json", json.dumps(info).encode()

    with loopback_server(answer) as address:
        endpoints = {"OIDC_OP_TOKEN_ENDPOINT": f"http://{address}/token",
                     "OIDC_OP_USER_ENDPOINT": f"http://{address}/userinfo"}  # fmt: skip
        with oidc_on(provider, **endpoints):
            query = parse_qs(urlsplit(client.get("/accounts/oidc/login/")["Location"]).query)
            assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
            started["nonce"] = query["nonce"][0]
            callback = {"code": "c0de", "state": query["state"][0]}
            first = client.get("/accounts/oidc/callback/", callback)
            again = client.get("/accounts/oidc/callback/", callback) if replay else None
    return first, again


def _refusal(response) -> str:
    """The message the login page shows for a refused sign-in."""
    assert response.status_code == 400, response.status_code
    found = re.search(r'id="sso-error">([^<]*)<', response.content.decode())
    assert found, "no message on the page"
    return html.unescape(found[1])


def test_a_well_formed_answer_signs_in_the_control_case(provider, mapped, tenant):
    first, _ = _callback_with(
        provider, lambda nonce: sign_jwt(_claims(provider, nonce), provider.private_key, provider.kid)
    )
    assert first.status_code == 302
    assert Membership.objects.get(user__username="mallory", tenant=tenant).role == Role.OWNER


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("forged", "signature does not match"),
        ("expired", "has expired"),
        ("audience", "another client"),
        ("issuer", "another provider"),
        ("unknown key", "key the provider does not publish"),
        ("no kid", "not a valid ID token"),
        ("alg none", "The ID token is signed with"),
    ],
)
def test_bad_id_tokens_are_refused_with_a_message_and_create_nothing(provider, mapped, case, message):
    from cryptography.hazmat.primitives.asymmetric import rsa

    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(nonce):
        claims = _claims(provider, nonce)
        key, kid = provider.private_key, provider.kid
        if case == "forged":
            key = other_key
        elif case == "expired":
            claims |= {"iat": claims["iat"] - 3600, "exp": claims["iat"] - 1800}
        elif case == "audience":
            claims["aud"] = "another-portal"
        elif case == "issuer":
            claims["iss"] = "http://127.0.0.1:1/evil"
        elif case == "unknown key":
            key, kid = other_key, "no-such-kid"
        elif case == "no kid":
            kid = None
        else:
            return sign_jwt(claims, key, kid, alg="none")
        return sign_jwt(claims, key, kid)

    first, _ = _callback_with(provider, token)
    assert message in _refusal(first)
    assert not User.objects.filter(username="mallory").exists()


def test_a_replayed_state_is_refused(provider, mapped):
    first, again = _callback_with(
        provider,
        lambda nonce: sign_jwt(_claims(provider, nonce), provider.private_key, provider.kid),
        replay=True,
    )
    assert first.status_code == 302
    assert "already used or has expired" in _refusal(again)


def test_a_groups_claim_that_is_not_a_list_is_refused(provider, mapped):
    def token(nonce):
        return sign_jwt(_claims(provider, nonce, groups=OWNERS), provider.private_key, provider.kid)

    first, _ = _callback_with(
        provider, token, userinfo={"sub": "sub-mallory", "preferred_username": "mallory", "groups": OWNERS}
    )
    assert "is not a list of group names" in _refusal(first)
    assert not User.objects.filter(username="mallory").exists()
    assert not DirectoryAccount.objects.exists()


def test_a_provider_name_that_is_a_local_account_is_refused(provider, member):
    def token(nonce):
        return sign_jwt(
            _claims(provider, nonce, preferred_username="member"), provider.private_key, provider.kid
        )

    first, _ = _callback_with(
        provider, token, userinfo={"sub": "sub-mallory", "preferred_username": "member"}
    )
    assert "exists and is not linked" in _refusal(first)
    assert not DirectoryAccount.objects.exists()


def test_a_password_login_with_a_code_in_its_query_never_reaches_the_provider(provider, member):
    calls = []

    def answer(request):
        calls.append(request.path)
        return 400, "application/json", b'{"error": "invalid_grant"}'

    with (
        loopback_server(answer) as address,
        oidc_on(provider, OIDC_OP_TOKEN_ENDPOINT=f"http://{address}/token"),
    ):
        response = Client().post(
            "/accounts/login/?code=x&state=y", {"username": "member", "password": "wrong"}
        )
        token = APIClient().post(
            "/api/v1/auth/token/?code=x&state=y", {"username": "member", "password": "wrong"}, format="json"
        )
    assert response.status_code == 200 and token.status_code == 400
    assert calls == []


def test_an_htmx_poll_past_the_renewal_reloads_the_page_instead_of_following_a_redirect(provider, member):
    client = Client()
    with oidc_on(provider):
        client.force_login(member, backend="identity.oidc.OidcBackend")
        session = client.session
        session["oidc_id_token_expiration"] = 0
        session.save()
        poll = client.get("/t/protein-lab/jobs/rows/", HTTP_HX_REQUEST="true")
        page = client.get("/t/protein-lab/jobs/")
    assert poll.status_code == 204 and poll["HX-Refresh"] == "true"
    assert page.status_code == 302 and page["Location"].startswith(provider.authorization_endpoint)
    assert "prompt=none" in page["Location"]
