"""The end of a job (docs/architecture.md, the flow of a job, step 5): charge the GPU-hours it
used, release its reservation and GPUs, and let admission give them to the next waiting job."""

from collections import defaultdict
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from clusters.backends.base import JobStatus
from clusters.models import Partition
from clusters.selectors import catalog_names
from jobs.models import Job, JobEvent, JobState
from jobs.services.admission import jobs_admit_soon
from jobs.services.common import last_event_times, moved_event, reported_at, unseen_start_event
from jobs.states import END_STATES
from portal.core.metrics import jobs_ended
from tenants.services import grant_settle


def job_finish(*, job_id: int, status: JobStatus | None, reject_reason: str = "") -> bool:
    """Any → an end state: charge the real GPU-hours (elapsed × GPUs × each one's device
    fraction) to the grant, release the
    reservation and the GPUs, record exit code and times, and admit the next waiting job.
    `status` None: the scheduler refused the job (REJECTED, reject_reason)."""
    partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=job_id)
    return bool(_finish(partition_id, {job_id: (status, reject_reason)}))


def jobs_finish(statuses: dict[int, JobStatus]) -> int:
    """job_finish for many jobs (job id → end status): one transaction per partition, its grants
    settled once each, one admission pass after. Returns how many ended here (not before)."""
    ends: dict[int, dict[int, tuple[JobStatus | None, str]]] = defaultdict(dict)
    for pk, partition_id in Job.objects.filter(pk__in=statuses).values_list("pk", "partition_id"):
        ends[partition_id][pk] = (statuses[pk], "")
    return sum(_finish(partition_id, ends[partition_id]) for partition_id in sorted(ends))


# What an end changes in a job's row.
_FINISHED_FIELDS = [
    *("state", "reason", "raw_state", "exit_code", "started_at", "node_list", "finished_at"),
    *("gpu_hours", "holds_gpus", "dispatch_lease_until"),
]


def _finish(partition_id: int, ends: dict[int, tuple[JobStatus | None, str]]) -> int:
    """The ends of jobs of one partition. Lock order: partition → jobs (by id) → grants (by id)."""
    with transaction.atomic():
        Partition.objects.select_for_update(no_key=True).get(pk=partition_id)
        jobs = list(Job.objects.select_for_update().filter(pk__in=ends).order_by("pk"))
        now = timezone.now()
        last_at = last_event_times([job.pk for job in jobs])
        events, ended = [], []
        settle: dict[int, list] = defaultdict(lambda: [Decimal(0), Decimal(0), 0])  # reserved, used, GPUs
        for job in jobs:
            if job.state in END_STATES:
                continue
            status, reject_reason = ends[job.pk]
            ended_at = None
            if status is None:
                events.append(moved_event(job, JobState.REJECTED, reason=reject_reason))
            else:
                after = max(filter(None, (job.submitted_at, last_at.get(job.pk))), default=None)
                started = reported_at(status.started_at, after=after)
                job.started_at = job.started_at or started
                unseen = (
                    unseen_start_event(job, started, after=after)
                    if status.state != JobState.REJECTED
                    else None
                )
                if unseen is not None:
                    events.append(unseen)
                    after = unseen.at
                ended_at = reported_at(status.finished_at, after=after)
                events.append(
                    moved_event(
                        job, status.state, reason=status.reason, raw_state=status.raw_state, at=ended_at
                    )
                )
                job.exit_code = status.exit_code
                job.node_list = status.node_list or job.node_list
            job.finished_at = (ended_at if status else None) or now  # as its end event says
            elapsed_s = (job.finished_at - job.started_at).total_seconds() if job.started_at else 0.0
            # device-equivalent: units × what each counts of a device (clusters/shares.py)
            hours = Decimal(str(max(0.0, elapsed_s))) / 3600 * job.gpus * job.device_fraction
            job.gpu_hours = hours.quantize(Decimal("0.0001"))
            grant = settle[job.grant_id]
            grant[0] += job.reserved_gpu_hours
            grant[1] += min(job.gpu_hours, job.reserved_gpu_hours)  # as grant_settle charges each job
            grant[2] += job.gpus if job.holds_gpus else 0
            job.holds_gpus, job.dispatch_lease_until = False, None
            ended.append(job)
        for grant_id in sorted(settle):
            reserved, used, gpus = settle[grant_id]
            grant_settle(grant_id=grant_id, reserved_gpu_hours=reserved, used_gpu_hours=used, gpus=gpus)
        JobEvent.objects.bulk_create(events)
        # batches of 100: each field's CASE names every job of its batch, and PostgreSQL tries
        # them in turn for every row
        Job.objects.bulk_update(ended, _FINISHED_FIELDS, batch_size=100)
        if ended:
            transaction.on_commit(lambda: jobs_admit_soon(partition_id=partition_id))
            transaction.on_commit(lambda: _count_ends(ended))
    return len(ended)


def _count_ends(jobs: list[Job]) -> None:
    """portal_jobs_ended_total, once the ends are committed."""
    clusters = catalog_names(jobs).cluster  # the process's copy: no query once it is read
    for job in jobs:
        jobs_ended.labels(clusters[job.cluster_id], job.state).inc()
