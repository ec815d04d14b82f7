"""The directory sync, run by beat every LDAP_SYNC_INTERVAL_S while LDAP is on."""

from celery import shared_task
from django.conf import settings


@shared_task(ignore_result=True)
def sync_directory() -> dict[str, int]:
    if not settings.LDAP_SERVER_URI:
        return {}
    from identity.ldap import sync_ldap_users  # python-ldap only where LDAP is on

    return sync_ldap_users()
