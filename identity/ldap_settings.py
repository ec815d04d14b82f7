"""django-auth-ldap's settings from LDAP_* (portal/settings.py calls this only when
LDAP_SERVER_URI is set, so a site without LDAP needs no python-ldap)."""

from django.core.exceptions import ImproperlyConfigured

from portal.envvars import env_bool, env_secret, env_str


def _fraction(name: str, default: str) -> float:
    text = env_str(name, default)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise ImproperlyConfigured(f"{name}={text!r} is not a fraction above 0 and at most 1")
    return value


def ldap_settings() -> dict:
    try:
        import ldap
        from django_auth_ldap.config import GroupOfNamesType, LDAPSearch
    except ImportError:
        raise ImproperlyConfigured(
            "LDAP_SERVER_URI is set but django-auth-ldap is not installed: pip install -e '.[ldap]' "
            "(python-ldap compiles against libldap2-dev and libsasl2-dev)"
        ) from None
    uri = env_str("LDAP_SERVER_URI")
    start_tls = env_bool("LDAP_START_TLS", not uri.startswith("ldaps://"))
    if not (start_tls or uri.startswith("ldaps://")) and not env_bool("LDAP_ALLOW_PLAINTEXT", False):
        raise ImproperlyConfigured(
            "LDAP_SERVER_URI: passwords would cross the network in clear; use ldaps:// or LDAP_START_TLS=true"
        )
    uid_attr = env_str("LDAP_UID_ATTR", "entryUUID")
    user_base = env_str("LDAP_USER_BASE")
    group_base = env_str("LDAP_GROUP_BASE")
    if not (user_base and group_base):
        raise ImproperlyConfigured("LDAP_SERVER_URI is set: LDAP_USER_BASE and LDAP_GROUP_BASE are needed")
    options = {
        ldap.OPT_X_TLS_REQUIRE_CERT: ldap.OPT_X_TLS_DEMAND,
        ldap.OPT_NETWORK_TIMEOUT: 10,
        ldap.OPT_TIMEOUT: 10,
        ldap.OPT_REFERRALS: 0,
    }
    ca_file = env_str("LDAP_CA_FILE")
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    options[ldap.OPT_X_TLS_NEWCTX] = 0  # last: applies the TLS options above to this connection
    config = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_BIND_DN": env_str("LDAP_BIND_DN"),
        "AUTH_LDAP_BIND_PASSWORD": env_secret("LDAP_BIND_PASSWORD") or "",
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(
            user_base, ldap.SCOPE_SUBTREE, env_str("LDAP_USER_FILTER", "(uid=%(user)s)"), ["*", uid_attr]
        ),
        "AUTH_LDAP_GROUP_SEARCH": LDAPSearch(
            group_base, ldap.SCOPE_SUBTREE, env_str("LDAP_GROUP_FILTER", "(objectClass=groupOfNames)")
        ),
        "AUTH_LDAP_GROUP_TYPE": GroupOfNamesType(),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,  # the sync must read the directory, not a cached answer
        "LDAP_CLUSTER_USERNAME_ATTR": env_str("LDAP_CLUSTER_USERNAME_ATTR", "uid"),
        # Who a person is: an attribute that no rename changes and no new person inherits
        # (OpenLDAP's entryUUID; 389-ds nsUniqueId). Operational: asked for by name.
        "LDAP_UID_ATTR": uid_attr,
        "AUTH_LDAP_USER_ATTRLIST": ["*", uid_attr],
        # A user outside it is disabled in the directory's sense (identity.ldap.directory_allows).
        "LDAP_ACTIVE_GROUP": env_str("LDAP_ACTIVE_GROUP"),
        "LDAP_SYNC_MAX_GONE": _fraction("LDAP_SYNC_MAX_GONE", "0.2"),
    }
    return config
