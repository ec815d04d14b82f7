"""Thin Celery tasks of monitoring: one delivery of alerts, with its retries."""

from celery import shared_task
from django.conf import settings

from monitoring.services import delivery_attempt

# Between attempts: 30 s, 1, 2, 4, 8 … minutes, up to an hour.
RETRY_BASE_S = 30
RETRY_MAX_S = 3600


@shared_task(bind=True, acks_late=True, soft_time_limit=60, time_limit=90, max_retries=None)
def deliver_alerts(self, *, delivery_id: int) -> bool | None:
    """Send one delivery; while it fails and has attempts left (ALERT_DELIVERY_ATTEMPTS), again
    later. The row counts the attempts, so a message delivered twice tries no more than that."""
    sent = delivery_attempt(delivery_id=delivery_id)
    if sent is False:
        countdown = min(RETRY_BASE_S * 2 ** min(self.request.retries, 10), RETRY_MAX_S)
        countdown = min(countdown, settings.ALERT_DELIVERY_RETRY_MAX_S)
        raise self.retry(countdown=countdown)
    return sent
