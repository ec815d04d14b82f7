"""Who signs in: the portal's own accounts, OpenID Connect and LDAP (identity/; README,
"Signing in with the institution's identity")."""

from django.core.exceptions import ImproperlyConfigured

from portal.envvars import env_bool, env_choice, env_int, env_secret, env_str
from portal.settings.base import AUTHENTICATION_BACKENDS

# The login page's username and password form (the portal's own accounts, and LDAP's). Off, the
# page offers only the identity provider; the console's login and POST /auth/token/ refuse too.
LOCAL_LOGIN = env_bool("LOCAL_LOGIN", True)

# --- Institutional identity (identity/; README: "Sign-in with the institution's identity")
# OpenID Connect, on when OIDC_ISSUER is set: mozilla-django-oidc as the relying party, endpoints
# from the issuer's discovery document (read once per process, identity/oidc.py).
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_secret("OIDC_CLIENT_SECRET") or ""
# offline_access: a refresh token that outlives the provider's session, for the sync (identity/oidc.py).
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile groups offline_access")
# `consent` for providers that issue offline_access only when asked with prompt=consent (the
# spec's rule, e.g. node's oidc-provider); Keycloak and Entra ID do not need it.
OIDC_PROMPT = env_choice("OIDC_PROMPT", "", {"", "consent", "login", "select_account"})
OIDC_RP_SIGN_ALGO = env_choice("OIDC_SIGN_ALGO", "RS256", {"RS256", "RS384", "RS512", "ES256", "ES384"})
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_CLUSTER_USERNAME_CLAIM = env_str("OIDC_CLUSTER_USERNAME_CLAIM", "uid")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
OIDC_TIMEOUT = env_int("OIDC_TIMEOUT_S", 10, minimum=1, maximum=60)
# How long a sign-in stands before the provider is asked again (prompt=none): a user the provider
# has signed out or disabled loses the portal's session then (mozilla-django-oidc's SessionRefresh).
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("OIDC_RENEW_SECONDS", 900, minimum=30)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
# How often every user who signed in through LDAP or the provider is asked about again (groups
# followed; a user gone from the directory loses sessions and tokens): identity/tasks.py.
DIRECTORY_SYNC_INTERVAL_S = env_int("DIRECTORY_SYNC_INTERVAL_S", 900, minimum=60)
# Lazy: read from the discovery document when first used, never while OIDC is off.
from identity.discovery import endpoint  # noqa: E402  (imports only requests and Django's utils)

OIDC_OP_AUTHORIZATION_ENDPOINT = endpoint("authorization_endpoint")
OIDC_OP_TOKEN_ENDPOINT = endpoint("token_endpoint")
OIDC_OP_USER_ENDPOINT = endpoint("userinfo_endpoint")
OIDC_OP_JWKS_ENDPOINT = endpoint("jwks_uri")
if OIDC_ISSUER and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ImproperlyConfigured(
        "OIDC_ISSUER is set: OIDC_CLIENT_ID and OIDC_CLIENT_SECRET (or _FILE) are needed"
    )
# LDAP, on when LDAP_SERVER_URI is set: django-auth-ldap (the `ldap` extra), over StartTLS or
# ldaps:// with the site's CA (identity/ldap.py reads the rest of LDAP_*).
LDAP_SERVER_URI = env_str("LDAP_SERVER_URI", "")
if LDAP_SERVER_URI:
    from identity.ldap_settings import ldap_settings

    globals().update(ldap_settings())
# After the portal's own accounts: a directory's user never takes over a local account of the
# same name (identity/ldap.py and identity/oidc.py refuse it).
if not LOCAL_LOGIN:  # the portal's passwords refused; permissions still read by ModelBackend's rules
    AUTHENTICATION_BACKENDS[1] = "identity.backends.PermissionsOnlyBackend"
AUTHENTICATION_BACKENDS[2:2] = [
    *(["identity.ldap.LdapBackend"] if LDAP_SERVER_URI else []),
    *(["identity.oidc.OidcBackend"] if OIDC_ISSUER else []),
]
