import time

from celery import shared_task
from django.core.cache import cache

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
