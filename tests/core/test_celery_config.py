"""The Celery app's defaults: a task outlives neither its limits nor the broker's visibility."""

from celery.schedules import crontab
from django.conf import settings

from portal.celery import app


def test_defaults_ack_late_and_prefetch_one():
    assert app.conf.task_acks_late is True
    assert app.conf.task_reject_on_worker_lost is True
    assert app.conf.worker_prefetch_multiplier == 1


def test_every_task_stops_before_the_broker_redelivers_it():
    app.loader.import_default_modules()
    visibility_s = app.conf.broker_transport_options["visibility_timeout"]
    tasks = {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}
    assert tasks, "no project task is registered"
    for name, task in tasks.items():
        soft = task.soft_time_limit or app.conf.task_soft_time_limit
        hard = task.time_limit or app.conf.task_time_limit
        assert soft is not None and hard is not None, f"{name} has no time limit"
        assert soft < hard < visibility_s, f"{name}: {soft} < {hard} < {visibility_s} does not hold"


def test_beat_schedule_names_registered_tasks_that_expire_before_their_next_run():
    app.loader.import_default_modules()
    assert app.conf.beat_schedule == settings.CELERY_BEAT_SCHEDULE != {}
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in app.tasks
        # A beat message that waits past its next run is stale: it must expire, not pile up.
        schedule = entry["schedule"]
        if isinstance(schedule, crontab):  # once a day at an hour (make-statements): before the next
            assert len(schedule.hour) == 1 and entry["options"]["expires"] <= 86400
        else:
            assert entry["options"]["expires"] <= schedule


def test_a_message_under_apply_tenants_old_name_is_still_applied(monkeypatch):
    """apply_tenant moved from jobs.tasks to tenants.tasks: a message queued under the old name
    before a deploy reaches the same work instead of being dropped as unregistered."""
    import tenants.tasks

    applied = []
    monkeypatch.setattr(tenants.tasks, "tenant_apply", lambda **kwargs: applied.append(kwargs))
    result = app.tasks["jobs.tasks.apply_tenant"].apply(kwargs={"tenant_id": 7, "cluster_id": 3})
    assert result.successful() and applied == [{"tenant_id": 7, "cluster_id": 3}]
