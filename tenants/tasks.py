from celery import shared_task

from tenants.services import grants_remind_ending, quota_requests_expire


@shared_task(acks_late=True, soft_time_limit=120, time_limit=150)
def expire_quota_requests() -> int:
    """pending → expired for requests whose end date passed."""
    return quota_requests_expire()


@shared_task(acks_late=True, soft_time_limit=120, time_limit=150)
def remind_grants_ending() -> int:
    """Mail the 7-day and 1-day reminders before grants end."""
    return grants_remind_ending()
