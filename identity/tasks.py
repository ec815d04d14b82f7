"""The directory sync, run by beat every DIRECTORY_SYNC_INTERVAL_S: each user who signed in
through LDAP or an OpenID provider is asked about again (identity/ldap.py, identity/oidc.py)."""

from celery import shared_task
from django.conf import settings


@shared_task(ignore_result=True)
def sync_directory() -> dict[str, int]:
    """Counts by outcome, LDAP's and OIDC's together."""
    counts = {"synced": 0, "gone": 0, "failed": 0, "held": 0}
    if settings.LDAP_SERVER_URI:
        from identity.ldap import sync_ldap_users  # python-ldap only where LDAP is on

        for outcome, number in sync_ldap_users().items():
            counts[outcome] += number
    if settings.OIDC_ISSUER:
        from identity.oidc import sync_oidc_users

        for outcome, number in sync_oidc_users().items():
            counts[outcome] += number
    return counts
