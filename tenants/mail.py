"""Quota mail. Sent after the transaction commits, so that no mail announces a change that
was rolled back; a failing mail server is logged and never undoes the decision."""

import logging

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import translation

log = logging.getLogger(__name__)


def mail_on_commit(*, template: str, to: list[str], context: dict) -> None:
    if not to:
        return
    context = {"site_url": settings.SITE_URL, **context}
    # In the site's mail language, not in whatever language the request or task has active.
    with translation.override(settings.MAIL_LANGUAGE):
        subject = render_to_string(f"mail/{template}_subject.txt", context).strip()
        body = render_to_string(f"mail/{template}.txt", context)

    def send() -> None:
        try:
            send_mail(subject, body, None, sorted(set(to)))
        except Exception:  # SMTP failures take many forms; the decision stands regardless
            log.exception("mail %s to %d recipients failed", template, len(to))

    transaction.on_commit(send)
