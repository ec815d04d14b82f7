"""Thin Celery tasks of webhooks: the scan of new events, and one delivery with its retries."""

from celery import shared_task

from webhooks.services import delivery_attempt, events_scan


@shared_task(acks_late=True, soft_time_limit=60, time_limit=90)
def scan_events() -> int:
    """New job events, quota decisions and ended grants into deliveries and job-end mail."""
    return events_scan()


@shared_task(bind=True, acks_late=True, soft_time_limit=30, time_limit=45, max_retries=None)
def deliver(self, *, delivery_id: int) -> None:
    """One attempt; while it fails and the day of retries lasts, again after the backoff the row
    records. The row counts attempts and says when the next is due, so a message delivered
    twice attempts no more than that."""
    wait = delivery_attempt(delivery_id=delivery_id)
    if wait is not None:
        raise self.retry(countdown=wait)
