"""Settings that turn the portal's OIDC or LDAP sign-in on against the suite's real servers
(tests/oidc_support.py, tests/ldap_support.py), built by the same code as production's
(identity/ldap_settings.py reads LDAP_* from the environment)."""

import os
from contextlib import contextmanager

from django.conf import settings
from django.test import override_settings

from identity import discovery

BASE_BACKENDS = ["portal.core.lockout.LockoutBackend", "django.contrib.auth.backends.ModelBackend"]
GUARDIAN = "guardian.backends.ObjectPermissionBackend"


def ldap_env(directory, *, uri: str | None = None, ca_file=None, **more: str) -> dict[str, str]:
    return {
        "LDAP_SERVER_URI": uri or directory.ldap_uri,
        "LDAP_CA_FILE": str(ca_file or directory.ca_file),
        "LDAP_BIND_DN": directory.reader_dn,
        "LDAP_BIND_PASSWORD": directory.reader_password,
        "LDAP_USER_BASE": directory.people_dn,
        "LDAP_GROUP_BASE": directory.groups_dn,
        **more,
    }


def _read_with(env: dict[str, str], read):
    """`read()` with these variables in the process's environment, as a site would set them, and
    the environment as it was afterwards (the portal reads its settings from there only)."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return read()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def ldap_on(directory, **kwargs):
    """The portal signs in against `directory` (StartTLS on its ldap:// port unless `uri` says
    ldaps://) while the block runs."""
    from identity.ldap_settings import ldap_settings

    env = ldap_env(directory, **kwargs)
    config = _read_with(env, ldap_settings)
    backends = [*BASE_BACKENDS, "identity.ldap.LdapBackend", GUARDIAN]
    with override_settings(
        LDAP_SERVER_URI=env["LDAP_SERVER_URI"], AUTHENTICATION_BACKENDS=backends, **config
    ):
        yield


@contextmanager
def oidc_on(provider, *, name: str = "Campus SSO", **more):
    """The portal signs in through `provider` (an OidcProvider) while the block runs."""
    backends = [*BASE_BACKENDS, "identity.oidc.OidcBackend", GUARDIAN]
    overrides = {
        "OIDC_ISSUER": provider.issuer,
        "OIDC_PROVIDER_NAME": name,
        "OIDC_PROMPT": "consent",  # oidc-provider grants offline_access only so (the spec's rule)
        "OIDC_RP_CLIENT_ID": provider.client_id,
        "OIDC_RP_CLIENT_SECRET": provider.client_secret,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": discovery.endpoint("authorization_endpoint"),
        "OIDC_OP_TOKEN_ENDPOINT": discovery.endpoint("token_endpoint"),
        "OIDC_OP_USER_ENDPOINT": discovery.endpoint("userinfo_endpoint"),
        "OIDC_OP_JWKS_ENDPOINT": discovery.endpoint("jwks_uri"),
        "AUTHENTICATION_BACKENDS": backends,
        **more,
    }
    discovery.forget()
    try:
        with override_settings(**overrides):
            yield settings
    finally:
        discovery.forget()
