"""Celery task runs, failures, retries and durations (portal.core.metrics), from Celery's own
signals in the process that runs the task; a pool process that ends is marked dead."""

from __future__ import annotations

import os
import time

from celery.signals import task_failure, task_postrun, task_prerun, task_retry, worker_process_shutdown

from portal.core import metrics

_started: dict[str, float] = {}  # task id → when it started, in this process
OTHER = "other"


def task_label(task) -> str:
    """The task's registered name if it is one of the portal's (bounded), else "other"."""
    name = getattr(task, "name", None) or ""
    return name if name.split(".", 1)[0] in {"jobs", "clusters", "tenants", "portal", "monitoring"} else OTHER


def _eager(task) -> bool:
    return bool(getattr(getattr(task, "request", None), "is_eager", False))


@task_prerun.connect
def _task_started(task_id=None, task=None, **_kwargs) -> None:
    if task_id is not None and not _eager(task):
        _started[task_id] = time.perf_counter()


@task_postrun.connect
def _task_ended(task_id=None, task=None, state=None, **_kwargs) -> None:
    started = _started.pop(task_id, None)
    if started is None:
        return
    label = task_label(task)
    metrics.task_seconds.labels(label).observe(time.perf_counter() - started)
    if state == "SUCCESS":
        metrics.task_runs.labels(label, "success").inc()


@task_failure.connect
def _task_failed(sender=None, **_kwargs) -> None:
    if not _eager(sender):
        metrics.task_runs.labels(task_label(sender), "failure").inc()


@task_retry.connect
def _task_retried(sender=None, **_kwargs) -> None:
    if not _eager(sender):
        metrics.task_runs.labels(task_label(sender), "retry").inc()


@worker_process_shutdown.connect
def _pool_process_ended(pid=None, **_kwargs) -> None:
    metrics.process_dead(pid or os.getpid())
