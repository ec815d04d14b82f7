"""GPU telemetry per running job: every GPU_SAMPLE_INTERVAL_S, one reading of each RUNNING job's
GPUs (utilization, framebuffer memory, temperature, power, XID), kept as JobGpuSample for
GPU_SAMPLE_KEEP_DAYS: the job page's charts, the dashboard's GPU efficiency and
GET /jobs/{id}/gpu-samples/ read them. The idle-GPU sweep (idle.py) reads the same source.

Where a cluster's figures come from, the first that is set or answers:
1. its prometheus_url: one PromQL instant query over the DCGM exporter's series that carry
   cluster="<slug>" (clusters/gpu_metrics.py says what they are matched on);
2. its backend's own (the local cluster: NVML, else nvidia-smi; Slurm and Kubernetes have none);
3. its metrics_url: a DCGM exporter's text exposition.
A cluster that cannot be read this time is reported and skipped; a job without a reading gets no
row (a gap in its charts, never a made-up zero).
"""

from __future__ import annotations

import logging
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


def cluster_gpu_samples(*, cluster: Cluster, backend_ids: list[str]) -> dict[str, GpuSample]:
    """Per-job GPU readings on one cluster, from the first source the module's docstring names.
    Raises BackendError or GpuMetricsError when that source cannot be read."""
    if cluster.prometheus_url:
        query = dcgm_promql(cluster.slug)
        return dcgm_job_samples(
            query_prometheus(cluster.prometheus_url, query, timeout_s=SOURCE_TIMEOUT_S), backend_ids
        )
    samples = backend_of(cluster).gpu_utilization(backend_ids)
    if samples or not cluster.metrics_url:
        return samples
    text = fetch_metrics(cluster.metrics_url, timeout_s=SOURCE_TIMEOUT_S)
    return dcgm_job_samples(parse_prometheus_text(text, names=DCGM_METRICS), backend_ids)


def running_by_cluster() -> dict[Cluster, list[Job]]:
    """The RUNNING jobs that a scheduler knows (a backend id), by cluster."""
    jobs = Job.objects.filter(state=JobState.RUNNING).exclude(backend_id="").select_related("cluster")
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


def jobs_sample_gpus(*, now: datetime | None = None) -> SampleReport:
    """Read every RUNNING job's GPUs once and keep the readings; drop those older than
    GPU_SAMPLE_KEEP_DAYS."""
    now = now or timezone.now()
    report = SampleReport()
    rows = []
    for cluster, jobs in running_by_cluster().items():
        try:
            samples = cluster_gpu_samples(cluster=cluster, backend_ids=[job.backend_id for job in jobs])
        except (BackendError, GpuMetricsError) as exc:  # BackendUnavailable included
            report.errors[cluster.slug] = str(exc)[:300]
            log.warning("GPU telemetry of cluster %s could not be read: %s", cluster.slug, exc)
            continue
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
    mean = sample.mean_pct if sample.mean_pct is not None else (sample.min_pct + sample.max_pct) / 2
    return JobGpuSample(
        job=job,
        at=at,
        gpus=sample.gpus,
        utilization_pct=mean,
        utilization_min_pct=sample.min_pct,
        utilization_max_pct=sample.max_pct,
        memory_used_mib=sample.memory_used_mib,
        memory_total_mib=sample.memory_total_mib,
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
        xid=sample.xid,
    )
