"""A task goes through the machine's Redis to a real worker process and back."""

import time

from django.core.cache import cache

from portal.core.tasks import HEARTBEAT_KEY, heartbeat, ping


def test_task_round_trips_through_redis(celery_worker):
    assert ping.delay().get(timeout=30) == "pong"


def test_heartbeat_from_the_worker_shows_in_readyz(celery_worker, client):
    before = time.time()
    stamped = heartbeat.delay().get(timeout=30)
    assert stamped >= before
    assert cache.get(HEARTBEAT_KEY) == stamped
    age = client.get("/readyz").json()["worker_heartbeat_age_s"]
    assert 0 <= age < 30
