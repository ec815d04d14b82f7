"""The portal's own Prometheus metrics: what each process counts as it works (this module, which
imports no app, so that every layer may count), and what is read from the database and the
broker when Prometheus scrapes (monitoring.collectors).

Processes: gunicorn runs several workers and Celery several pool processes, each with its own
memory. With PROMETHEUS_MULTIPROC_DIR set (scripts/run, scripts/stack, the Dockerfile), every
process writes its counters and histograms to files of its own in that folder
(prometheus_client's multiprocess mode) and /metrics adds them up, so that a scrape that lands
on any one worker sees them all. The folder must be emptied before the processes start, and a
process that ends is marked dead (gunicorn.conf.py's child_exit, the worker_process_shutdown
signal). Without it (tests, `manage.py runserver`) the metrics live in the one process.

Labels take only bounded values (docs/architecture.md, Metrics): a route is the URL pattern that
matched, never the path; a cluster or tenant is an admin-created slug; a task is one of the
portal's registered task names; states, methods and outcomes are fixed sets. No label ever holds
a job id, a username or a token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

# Buckets around the SLA: the API's P99 must stay under 200 ms, so the edges 150/200/250 ms
# let histogram_quantile tell 190 ms from 210 ms.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.75, 1, 2.5, 5, 10)
# A task, a dispatch or a poll: a few ms to the task time limit (300 s).
TASK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

http_request_seconds = Histogram(
    "portal_http_request_duration_seconds",
    "Time from the first middleware to the answer, per URL pattern, method and status.",
    ["route", "method", "status"],
    buckets=LATENCY_BUCKETS,
)
http_throttled = Counter(
    "portal_http_requests_throttled_total",
    "Requests refused for their rate (429) or shed under overload (503), per URL pattern.",
    ["route", "status"],
)
http_failed = Counter(
    "portal_http_requests_failed_total",
    "Requests answered with a server error (5xx other than a shed 503), per URL pattern.",
    ["route"],
)
task_runs = Counter(
    "portal_celery_task_runs_total",
    "Celery task runs by their outcome (success, failure, retry).",
    ["task", "outcome"],
)
task_seconds = Histogram(
    "portal_celery_task_duration_seconds",
    "Celery task run time, per task.",
    ["task"],
    buckets=TASK_BUCKETS,
)
dispatch_seconds = Histogram(
    "portal_dispatch_cycle_duration_seconds",
    "One dispatch of a batch of jobs into a cluster's scheduler, per cluster.",
    ["cluster"],
    buckets=TASK_BUCKETS,
)
dispatch_jobs = Counter(
    "portal_dispatch_jobs_total",
    "Jobs a dispatch handed to a cluster, by outcome: submitted, rejected (the scheduler refused "
    "it for good), retry (to be tried again), unavailable (the cluster could not be reached).",
    ["cluster", "outcome"],
)
poll_seconds = Histogram(
    "portal_poll_cycle_duration_seconds",
    "One poll of a cluster's scheduler for all its active jobs, per cluster.",
    ["cluster"],
    buckets=TASK_BUCKETS,
)
cluster_errors = Counter(
    "portal_cluster_errors_total",
    "Failures to reach or use a cluster, per cluster and transport (ssh: Slurm, api: Kubernetes, "
    "local: this machine).",
    ["cluster", "transport"],
)
jobs_ended = Counter(
    "portal_jobs_ended_total",
    "Jobs that reached an end state, per cluster and state.",
    ["cluster", "state"],
)


def multiprocess_dir() -> str | None:
    """The folder the processes share their metrics through, or None for one-process metrics."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_registry() -> CollectorRegistry:
    """The metrics every process counted: summed over the multiprocess folder's files where one
    is set, else this process's own (the default registry, with its process_* metrics)."""
    path = multiprocess_dir()
    if path is None:
        from prometheus_client import REGISTRY

        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    return registry


def process_dead(pid: int) -> None:
    """A process of the portal ended: its live gauges go (its counters stay counted)."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


@contextmanager
def timed(histogram: Histogram, **labels: str) -> Iterator[None]:
    """Observe the block's duration, whether it returns or raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.labels(**labels).observe(time.perf_counter() - started)
