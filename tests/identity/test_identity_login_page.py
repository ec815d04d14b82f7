"""The login page's choices (identity.views): the portal's form alone by default; the provider's
button beside it when OIDC is on; the form gone, and the portal's passwords refused everywhere,
when LOCAL_LOGIN is off, while staff keep their powers through ModelBackend's rules."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import override_settings
from rest_framework.test import APIClient

from portal.core.staff import ROLE_PLATFORM_ADMIN, is_platform_admin
from tests.factories import PASSWORD, UserFactory

User = get_user_model()

pytestmark = pytest.mark.django_db

NO_PASSWORDS = [
    "portal.core.lockout.LockoutBackend",
    "identity.backends.PermissionsOnlyBackend",
    "guardian.backends.ObjectPermissionBackend",
]


def test_by_default_the_page_has_the_form_and_no_provider(client):
    page = client.get("/accounts/login/").content.decode()
    assert 'name="password"' in page and "Sign in with" not in page


def test_with_a_provider_the_page_offers_it_beside_the_form(client):
    with override_settings(OIDC_ISSUER="https://sso.uni.example", OIDC_PROVIDER_NAME="UniID"):
        page = client.get("/accounts/login/?next=/t/protein-lab/").content.decode()
    assert "Sign in with UniID" in page and 'name="password"' in page
    assert 'href="/accounts/oidc/login/?next=/t/protein-lab/"' in page


def test_without_local_login_the_portals_passwords_are_refused_everywhere(client, member):
    padmin = UserFactory(username="padmin", is_staff=True)
    padmin.groups.add(Group.objects.get(name=ROLE_PLATFORM_ADMIN))
    off = {
        "OIDC_ISSUER": "https://sso.uni.example",
        "LOCAL_LOGIN": False,
        "AUTHENTICATION_BACKENDS": NO_PASSWORDS,
    }
    with override_settings(**off):
        page = client.get("/accounts/login/").content.decode()
        assert 'name="password"' not in page and "Sign in with single sign-on" in page
        response = client.post("/accounts/login/", {"username": "member", "password": PASSWORD})
        assert response.status_code == 400 and "_auth_user_id" not in client.session
        token = APIClient().post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD})
        assert token.status_code == 400
        assert is_platform_admin(User.objects.get(pk=padmin.pk))  # a role's powers still read


def test_the_sign_in_route_is_404_while_oidc_is_off(client):
    response = client.get("/accounts/oidc/login/")
    assert response.status_code == 404 and "not set up" in response.content.decode()
