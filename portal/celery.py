"""The Celery app. Configuration lives in settings (CELERY_*), the beat schedule too."""

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def close_old_connections(task=None, **_kwargs) -> None:
    """Around each task, what Django does around each request: drop a database connection that
    broke or outlived CONN_MAX_AGE, keep the others (settings.CELERY_DB_REUSE_MAX stops the
    fixup from closing every one, and a new connection per task)."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections as close_old

    close_old()
