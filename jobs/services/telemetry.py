"""GPU telemetry per running job: every GPU_SAMPLE_INTERVAL_S, one reading of each RUNNING job's
GPUs (utilization, framebuffer memory, temperature, power, XID), kept as JobGpuSample for
GPU_SAMPLE_KEEP_DAYS: the job page's charts, the dashboard's GPU efficiency and
GET /jobs/{id}/gpu-samples/ read them. The idle-GPU sweep (idle.py) reads the same source.

Where a job's figures come from, the first of its cluster's sources that reports the job:
1. its prometheus_url: one PromQL instant query over the DCGM exporter's series that carry
   cluster="<slug>" (clusters/gpu_metrics.py says what they are matched on);
2. its backend's own (the local cluster: NVML, else nvidia-smi; Slurm and Kubernetes have none);
3. its metrics_url: a DCGM exporter's text exposition.
A cluster that cannot be read this time is reported and skipped; a job without a reading gets no
row (a gap in its charts, never a made-up zero).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from clusters.backends.base import BackendError, GpuSample
from clusters.gpu_metrics import (
    DCGM_METRICS,
    GpuMetricsError,
    dcgm_job_samples,
    dcgm_promql,
    fetch_metrics,
    parse_prometheus_text,
    query_prometheus,
)
from clusters.models import Cluster
from clusters.services import backend_of
from jobs.models import Job, JobGpuSample, JobState

log = logging.getLogger("jobs.services")

SOURCE_TIMEOUT_S = 10.0
# The most one round spends starting on clusters: below the sample_gpus task's soft limit (45 s),
# with a source's timeout to spare.
ROUND_BUDGET_S = 30.0


def cluster_gpu_samples(*, cluster: Cluster, backend_ids: list[str]) -> dict[str, GpuSample]:
    """Per-job GPU readings on one cluster: each job from the first source of the module's
    docstring that reports it (a job that Prometheus does not map, a local job on a machine whose
    exporter has no job mapping, is asked of the next). Raises BackendError or GpuMetricsError
    when a source that is set cannot be read."""
    samples: dict[str, GpuSample] = {}
    if cluster.prometheus_url:
        series = [
            one
            for query in dcgm_promql(cluster.slug)
            for one in query_prometheus(cluster.prometheus_url, query, timeout_s=SOURCE_TIMEOUT_S)
        ]
        samples = dcgm_job_samples(series, backend_ids, xid_absent=0)
    missing = [backend_id for backend_id in backend_ids if backend_id not in samples]
    if missing:
        samples |= backend_of(cluster).gpu_utilization(missing)
        missing = [backend_id for backend_id in missing if backend_id not in samples]
    if missing and cluster.metrics_url:
        text = fetch_metrics(cluster.metrics_url, timeout_s=SOURCE_TIMEOUT_S)
        samples |= dcgm_job_samples(parse_prometheus_text(text, names=DCGM_METRICS), missing)
    return samples


def running_by_cluster() -> dict[Cluster, list[Job]]:
    """The RUNNING jobs that a scheduler knows (a backend id), by cluster, in order of id (with
    what the idle sweep's mail needs: tenant and submitter)."""
    jobs = (
        Job.objects.filter(state=JobState.RUNNING)
        .exclude(backend_id="")
        .select_related("cluster", "tenant", "submitted_by")
    )
    by_cluster: dict[Cluster, list[Job]] = {}
    for job in jobs.order_by("cluster_id", "id"):
        by_cluster.setdefault(job.cluster, []).append(job)
    return by_cluster


@dataclass
class SampleReport:
    """What one round read: job ids with a new row, clusters that could not be read, rows pruned."""

    sampled: list[int] = field(default_factory=list)
    unread: list[int] = field(default_factory=list)  # RUNNING jobs their cluster gave no reading for
    errors: dict[str, str] = field(default_factory=dict)  # cluster slug → why it was not read
    pruned: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def jobs_sample_gpus(*, now: datetime | None = None, budget_s: float = ROUND_BUDGET_S) -> SampleReport:
    """Read every RUNNING job's GPUs once and keep the readings, cluster by cluster as each is
    read (a slow cluster costs no other its rows); a cluster not reached within budget_s (below
    the task's time limit) is reported and read next round. Then drop readings older than
    GPU_SAMPLE_KEEP_DAYS."""
    now = now or timezone.now()
    deadline = time.monotonic() + budget_s
    report = SampleReport()
    for cluster, jobs in running_by_cluster().items():
        if time.monotonic() > deadline:
            report.errors[cluster.slug] = "not reached in this round's time; read next round"
            continue
        try:
            samples = cluster_gpu_samples(cluster=cluster, backend_ids=[job.backend_id for job in jobs])
        except (BackendError, GpuMetricsError) as exc:  # BackendUnavailable included
            report.errors[cluster.slug] = str(exc)[:300]
            log.warning("GPU telemetry of cluster %s could not be read: %s", cluster.slug, exc)
            continue
        rows = []
        for job in jobs:
            sample = samples.get(job.backend_id)
            if sample is None:
                report.unread.append(job.pk)
                continue
            rows.append(sample_row(job, sample, at=now))
            report.sampled.append(job.pk)
        JobGpuSample.objects.bulk_create(rows, ignore_conflicts=True)  # a second round at the same instant
    keep = timedelta(days=settings.GPU_SAMPLE_KEEP_DAYS)
    report.pruned, _ = JobGpuSample.objects.filter(at__lt=now - keep).delete()
    return report


def sample_row(job: Job, sample: GpuSample, *, at: datetime) -> JobGpuSample:
    """The row of a reading. Where fewer GPUs were read than the job holds, the summed figures
    (memory, power) would be a part passed off as the whole: they stay null."""
    whole = sample.gpus >= job.gpus
    return JobGpuSample(
        job=job,
        at=at,
        gpus=sample.gpus,
        utilization_pct=sample.mean_pct,
        utilization_min_pct=sample.min_pct,
        utilization_max_pct=sample.max_pct,
        memory_used_mib=sample.memory_used_mib if whole else None,
        memory_total_mib=sample.memory_total_mib if whole else None,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w if whole else None,
        xid=sample.xid,
    )
