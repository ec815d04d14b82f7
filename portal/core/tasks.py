import time

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.utils import translation

HEARTBEAT_KEY = "portal:worker-heartbeat"


@shared_task(acks_late=True, soft_time_limit=10, time_limit=20)
def ping() -> str:
    """Round-trip probe for the broker and a worker."""
    return "pong"


@shared_task(acks_late=True, soft_time_limit=10, time_limit=20)
def heartbeat() -> float:
    """Beat sends this; the worker stamps the time, so /readyz can say when a worker last ran."""
    now = time.time()
    cache.set(HEARTBEAT_KEY, now, timeout=3600)
    return now


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90)
def send_password_reset(*, email: str, domain: str, use_https: bool) -> None:
    """Mail a link to set a new password to each active user with this address, or to no one.
    The page that asked answered before this ran (portal.core.accounts.PasswordResetView), so
    neither its content nor its timing depends on whether the address has an account. The
    link names the host the request came to; the mail is in the site's MAIL_LANGUAGE."""
    # Imported here: this module is imported before apps are loaded (a client that only sends
    # ping), and auth's forms import its models.
    from django.contrib.auth.forms import PasswordResetForm

    form = PasswordResetForm({"email": email})
    if not form.is_valid():
        return
    with translation.override(settings.MAIL_LANGUAGE):
        # Django's own send_mail logs an SMTP failure rather than raising: one attempt, as the
        # page's own would have been.
        form.save(
            domain_override=domain,
            use_https=use_https,
            extra_email_context={"valid_hours": settings.PASSWORD_RESET_TIMEOUT // 3600},
        )
