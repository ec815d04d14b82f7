"""Idle GPUs: a RUNNING job whose GPUs all stay under IDLE_GPU_THRESHOLD_PCT for
IDLE_GPU_WINDOW_MINUTES is mailed to its submitter, once per idle stretch; with IDLE_GPU_CANCEL it
is cancelled (reason idle_gpus) when it is still idle one more window after that mail.

Where utilization comes from: the same source as the GPU telemetry (telemetry.py: the cluster's
Prometheus, its backend's own, or its metrics_url; clusters/gpu_metrics.py says what it is
matched on). A job is idle when the busiest of its GPUs is under the threshold and every one of
its GPUs was sampled; busy, or with no sample, its stretch ends (Job.gpu_idle_since and
gpu_idle_flagged_at go back to null): what was not seen is never counted as idle. A cluster that
could not be read this time is left as it was and reported.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusters.backends.base import BackendError, GpuSample
from clusters.gpu_metrics import GpuMetricsError
from jobs.models import Job, JobState
from jobs.services.cancel import job_cancel
from jobs.services.telemetry import cluster_gpu_samples, running_by_cluster
from portal.core.services import audit_record
from tenants.mail import mail_on_commit

log = logging.getLogger("jobs.services")

CANCEL_REASON = "idle_gpus"


@dataclass
class IdleReport:
    """What one sweep saw and did (dry run: would do), as lists of job ids."""

    dry_run: bool
    idle: list[int] = field(default_factory=list)  # every GPU under the threshold now
    busy: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)  # no sample for (all of) its GPUs
    flagged: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # cluster slug → why it was not read

    def as_dict(self) -> dict:
        """Plain JSON-able data, as the task returns it."""
        return asdict(self)


def jobs_watch_idle(*, dry_run: bool | None = None) -> IdleReport:
    """Sample the GPUs of every RUNNING job, cluster by cluster; follow each job's idle stretch;
    flag (mail, audit job.idle_flagged) those idle for a window and, with IDLE_GPU_CANCEL, cancel
    (RUNNING → CANCELLING, reason idle_gpus) those still idle a window after their flag. Dry run
    (default: CLEANUP_DRY_RUN): the report only; nothing written, nothing sent."""
    dry_run = settings.CLEANUP_DRY_RUN if dry_run is None else dry_run
    report = IdleReport(dry_run=dry_run)
    if not dry_run:
        # A job the scheduler requeued (RUNNING → PENDING) starts over when it runs again.
        Job.objects.filter(state=JobState.PENDING).exclude(
            gpu_idle_since=None, gpu_idle_flagged_at=None
        ).update(gpu_idle_since=None, gpu_idle_flagged_at=None)
    for cluster, jobs in running_by_cluster().items():
        try:
            samples = cluster_gpu_samples(
                cluster=cluster, backend_ids=sorted({job.backend_id for job in jobs})
            )
        except (BackendError, GpuMetricsError) as exc:  # BackendUnavailable included
            log.warning("GPU utilization of cluster %s unavailable: %s", cluster.slug, exc)
            report.errors[cluster.slug] = str(exc)[:500]
            continue
        _follow(jobs, samples, report=report, now=timezone.now())
    return report


def _follow(jobs: list[Job], samples: dict[str, GpuSample], *, report: IdleReport, now: datetime) -> None:
    threshold = settings.IDLE_GPU_THRESHOLD_PCT
    window = timedelta(minutes=settings.IDLE_GPU_WINDOW_MINUTES)
    ended, started, due = [], [], []
    for job in jobs:
        sample = samples.get(job.backend_id)
        if sample is None or sample.gpus < job.gpus:
            report.unknown.append(job.pk)
            ended.append(job.pk)
        elif sample.max_pct >= threshold:
            report.busy.append(job.pk)
            ended.append(job.pk)
        else:
            report.idle.append(job.pk)
            if job.gpu_idle_since is None:
                started.append(job.pk)
            else:
                due.append(job)
    if not report.dry_run:
        Job.objects.filter(pk__in=ended).exclude(gpu_idle_since=None, gpu_idle_flagged_at=None).update(
            gpu_idle_since=None, gpu_idle_flagged_at=None
        )
        # Only where none is set: a second sweep at the same time (a slow one overlapping the
        # next beat) must not move a stretch's start later.
        Job.objects.filter(pk__in=started, gpu_idle_since=None).update(gpu_idle_since=now)
    for job in due:
        if job.gpu_idle_flagged_at is None:
            if now - job.gpu_idle_since >= window and _flag(job, now=now, report=report):
                report.flagged.append(job.pk)
        elif (
            settings.IDLE_GPU_CANCEL
            and now - job.gpu_idle_flagged_at >= window
            and _cancel(job, report=report)
        ):
            report.cancelled.append(job.pk)


def _flag(job: Job, *, now: datetime, report: IdleReport) -> bool:
    """Mail the submitter and audit, once per stretch: the conditional UPDATE is the claim, so
    that of two sweeps at once only one mails."""
    if report.dry_run:
        return True
    with transaction.atomic():
        claimed = Job.objects.filter(
            pk=job.pk, state=JobState.RUNNING, gpu_idle_since=job.gpu_idle_since, gpu_idle_flagged_at=None
        ).update(gpu_idle_flagged_at=now)
        if not claimed:
            return False
        idle_minutes = int((now - job.gpu_idle_since).total_seconds() // 60)
        audit_record(
            actor=None,
            action="job.idle_flagged",
            target=job,
            tenant=job.tenant,
            data={
                "idle_since": job.gpu_idle_since.isoformat(),
                "idle_minutes": idle_minutes,
                "threshold_pct": settings.IDLE_GPU_THRESHOLD_PCT,
                "cancel": settings.IDLE_GPU_CANCEL,
            },
        )
        user = job.submitted_by
        window = timedelta(minutes=settings.IDLE_GPU_WINDOW_MINUTES)
        mail_on_commit(
            template="gpu_idle",
            to=[user.email] if user is not None and user.is_active and user.email else [],
            context={
                "job": job,
                "idle_since": job.gpu_idle_since,
                "idle_hours": round(idle_minutes / 60, 1),
                "threshold_pct": settings.IDLE_GPU_THRESHOLD_PCT,
                "cancel_at": now + window if settings.IDLE_GPU_CANCEL else None,
            },
        )
    return True


def _cancel(job: Job, *, report: IdleReport) -> bool:
    """RUNNING → CANCELLING through job_cancel (which audits job.cancel with the reason), only if
    the job is still RUNNING and still in the stretch that was flagged."""
    if report.dry_run:
        return True
    with transaction.atomic():
        locked = (
            Job.objects.select_for_update()
            .filter(pk=job.pk, state=JobState.RUNNING, gpu_idle_flagged_at=job.gpu_idle_flagged_at)
            .first()
        )
        if locked is None:
            return False
        job_cancel(actor=None, job=locked, reason=CANCEL_REASON)
    return True
