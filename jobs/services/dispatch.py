"""Dispatch and the sweep (docs/architecture.md, the flow of a job, steps 3 and 6): the
database is the source of truth, not the queue."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from clusters.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    JobRef,
    JobSpec,
    JobStatus,
)
from clusters.breaker import ClusterBusy, breakers_cooling, cluster_slot
from clusters.models import Cluster
from clusters.services import backend_of, cluster_answered, cluster_available, cluster_mark_health
from jobs.models import Job, JobEvent, JobState
from jobs.selectors import awaiting_dispatch
from jobs.services.admission import grants_to_lock, job_held_back, job_unadmit_if_held, jobs_admit
from jobs.services.cancel import jobs_stop_overdue
from jobs.services.common import moved_event, send_now
from jobs.services.finish import job_finish
from jobs.services.stall import jobs_hold_for_cluster
from portal.core import metrics
from portal.core.metrics import timed
from tenants.models import QuotaGrant

# --- Dispatch


def job_claim(job_id: int) -> Job | None:
    """The dispatch lease of this one job (jobs_claim with a limit of 1), SUBMITTING; None when
    it is not claimable: another dispatcher holds it, or it was cancelled, ended or held back."""
    cluster_id = Job.objects.filter(pk=job_id).values_list("cluster_id", flat=True).first()
    jobs = jobs_claim(job_id, cluster_id=cluster_id, limit=1) if cluster_id else []
    return jobs[0] if jobs else None


# The QOS of jobs on borrowed GPUs (Slurm): below every tier's, which preempt it (requeue,
# after its GraceTime); clusters/backends/slurm/accounts.py sets it up.
BORROW_QOS = "portal-borrow"


def spec_of(job: Job) -> JobSpec:
    """What the backend is given to submit the job (its current attempt)."""
    return JobSpec(
        token=job.token,
        name=job.name,
        account=job.tenant.slug,
        qos=BORROW_QOS if job.gpus_borrowed else f"portal-{job.tenant.tier}",
        priority=job.priority,
        partition=job.partition.name,
        gpu_type=job.gpu_model.slurm_gres,
        k8s_resource=job.gpu_model.k8s_resource,
        k8s_product=job.gpu_model.k8s_product,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        walltime_minutes=attempt_minutes(job),
        script=job.script,
        env=dict(job.env),
        cpus_per_gpu=job.cpus_per_gpu,
        mem_per_gpu_mb=job.mem_per_gpu_mb,
        labels={"tenant": job.tenant.slug, "job": str(job.pk), "scenario": job.scenario.slug},
        user=job.cluster_user,
        vendor=job.gpu_model.vendor,
        share=job.share,
        mig_profile=job.mig_profile,
        gpu_memory_mib=job.gpu_memory_mib,
        gpu_cores_pct=job.gpu_cores_pct,
        preemptible=job.preemptible,
        borrowing=bool(job.gpus_borrowed),
        grace_s=_grace_s(job),
        attempt=job.attempt,
        checkpoint_key=f"job-{job.pk}",
        restarts=job.max_restarts > 0,
    )


def attempt_minutes(job: Job) -> int:
    """The walltime of the job's current attempt: its own, or on a restart what is left of its
    reservation (each attempt is charged from it: finish._requeue), at least a minute."""
    if job.attempt == 1:
        return job.walltime_minutes
    per_minute = job.gpus * job.device_fraction / 60
    return max(1, min(job.walltime_minutes, int(job.reserved_gpu_hours / per_minute)))


def _grace_s(job: Job) -> int:
    """How long before its stop a preemptible job is warned: its cohort's reclaim grace (the
    largest where its tenant is in several), else the site's default; 0 when not preemptible."""
    if not job.preemptible:
        return 0
    graces = job.tenant.cohort_places.filter(cohort__gpu_model_id=job.gpu_model_id).values_list(
        "cohort__reclaim_grace_s", flat=True
    )
    return max(graces, default=settings.JOB_PREEMPT_GRACE_S)


def jobs_dispatch(*, job_id: int, retry: bool = False, batch: int | None = None) -> int:
    """QUEUED (admitted) → SUBMITTING → PENDING: what the dispatch task runs. The job and up to
    batch - 1 other admitted jobs of its cluster that no dispatcher holds, claimed together and
    sent in one exchange with the scheduler (backend.submit_many; Slurm: one SSH exec for all
    their sbatch calls). `batch` is at most the backend's SUBMIT_BATCH, which it is by default.

    Safe to run twice and after a crash anywhere: each job has its own lease, so that one
    dispatcher works on it at a time; any attempt after its first asks the scheduler for its
    token before submitting again; a refusal makes it REJECTED; a job cancelled meanwhile has
    the scheduler's copy cancelled.

    A message whose job another dispatcher's batch took along costs one indexed query and
    ends, since each waiting job has a message of its own. A retry (`retry`: the last batch
    left jobs to try again, whose own messages are spent) takes what waits even then. Returns
    how many jobs this call took."""
    if not retry and not Job.objects.filter(awaiting_dispatch(timezone.now()), pk=job_id).exists():
        return 0
    cluster = Cluster.objects.filter(jobs=job_id).first()
    if cluster is None:
        return 0
    # --- Cluster stall guard (clusters/breaker.py, docs/architecture/cluster-stall.md): a
    # cluster whose breaker is open holds its jobs at once, in the database; one whose worker
    # slots are all taken sends the message back for later (ClusterBusy is retried), so that a
    # cluster that hangs holds CLUSTER_WORKER_SLOTS workers at most.
    if not cluster_available(cluster=cluster):
        jobs_hold_for_cluster(cluster_id=cluster.pk)
        return 0
    with cluster_slot(cluster_id=cluster.pk, hold_s=settings.JOB_DISPATCH_TIME_LIMIT_S) as slot:
        if not slot:
            raise ClusterBusy(f"{cluster.slug}: its {settings.CLUSTER_WORKER_SLOTS} worker slots are taken")
        return _dispatch_batch(job_id, cluster=cluster, batch=batch)


def _dispatch_batch(job_id: int, *, cluster: Cluster, batch: int | None) -> int:
    with timed(metrics.dispatch_seconds, cluster=cluster.slug):
        return _dispatch_claimed(job_id, cluster=cluster, batch=batch)


def _dispatch_claimed(job_id: int, *, cluster: Cluster, batch: int | None) -> int:
    backend = backend_of(cluster)
    jobs = jobs_claim(
        job_id, cluster_id=cluster.pk, limit=min(batch or backend.SUBMIT_BATCH, backend.SUBMIT_BATCH)
    )
    if jobs:
        jobs_submit_claimed(backend, jobs)
        cluster_answered(cluster=cluster)  # raised otherwise: an answer closes its breaker
    return len(jobs)


def jobs_claim(job_id: int, *, cluster_id: int, limit: int) -> list[Job]:
    """Take the dispatch leases of up to `limit` claimable jobs of one cluster, the given job
    first (with a limit of 1, that job alone): the leases in one transaction, rows another
    dispatcher is locking skipped rather than waited for, so of two dispatchers one wins each
    job; then their moves to SUBMITTING in a second. A job held back since its admission
    (suspended tenant, ended grant) gives its GPUs back instead; one cancelled or ended between
    the lease and the lock is left out."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.JOB_DISPATCH_LEASE_S)
    with transaction.atomic():
        ids = list(
            Job.objects.select_for_update(skip_locked=True)
            .filter(awaiting_dispatch(now), cluster_id=cluster_id, **({"pk": job_id} if limit == 1 else {}))
            .order_by(Case(When(pk=job_id, then=0), default=1), "pk")
            .values_list("pk", flat=True)[:limit]
        )
        Job.objects.filter(pk__in=ids).update(
            dispatch_lease_until=lease, dispatch_attempts=F("dispatch_attempts") + 1
        )
    if not ids:
        return []
    claimed, moved, events = [], [], []
    with transaction.atomic():
        jobs = list(
            # of=self: the job rows alone. A plain FOR UPDATE with select_related would also lock
            # their cluster, partition, GPU model and tenant rows, in whatever order the join
            # yields them, and deadlock with the services that lock a partition first.
            Job.objects.select_for_update(of=("self",))
            .select_related("cluster", "partition", "gpu_model", "tenant", "scenario")
            .filter(pk__in=ids)
            .order_by("pk")
        )
        grants = QuotaGrant.objects.in_bulk({job.grant_id for job in jobs})
        today = timezone.localdate()
        held_jobs = [job for job in jobs if job_held_back(job, grant=grants[job.grant_id], today=today)]
        if held_jobs:  # their un-admission settles grants, their loans' lenders' too: locked in id
            # order first, as admission does
            held = grants_to_lock([job.pk for job in held_jobs], {job.grant_id for job in held_jobs})
            list(QuotaGrant.objects.select_for_update(no_key=True).filter(pk__in=held).order_by("pk"))
        for job in jobs:
            if job.state == JobState.QUEUED:
                if not job.holds_gpus:
                    continue  # its GPUs went back since the lease (a reclaim before its submission)
                if job_held_back(job, grant=grants[job.grant_id], today=today) and job_unadmit_if_held(job):
                    continue  # suspended or grant ended since admission: not submitted
                events.append(moved_event(job, JobState.SUBMITTING))
                moved.append(job)
            elif job.state != JobState.SUBMITTING:
                continue  # cancelled or ended between the lease and the lock
            claimed.append(job)
        JobEvent.objects.bulk_create(events)
        # moved_event left each moved job SUBMITTING, no reason, its raw state as it was
        Job.objects.filter(pk__in=[job.pk for job in moved]).update(state=JobState.SUBMITTING, reason="")
    return claimed


def jobs_submit_claimed(backend: Backend, jobs: list[Job]) -> None:
    """Submit claimed SUBMITTING jobs of one cluster and record what became of each. Raises
    BackendUnavailable when any of them must be tried again, so that the task retries."""
    cluster = jobs[0].cluster
    by_pk = {job.pk: job for job in jobs}
    try:
        outcome = _scheduler_ids(backend, jobs)
    except BackendUnavailable as exc:  # nothing reached the scheduler
        metrics.dispatch_jobs.labels(cluster.slug, "unavailable").inc(len(jobs))
        cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
        Job.objects.filter(pk__in=by_pk).update(dispatch_lease_until=None)  # the retry may go at once
        raise
    except BackendError as exc:  # refused before any job, for all of them
        outcome = dict.fromkeys(by_pk, exc)
    submitted = {pk: result for pk, result in outcome.items() if isinstance(result, str)}
    if submitted:
        _save_submitted(backend, submitted)
    again = [pk for pk, result in outcome.items() if isinstance(result, BackendUnavailable)]
    unknown = [pk for pk, result in outcome.items() if result is None]
    retry = len(again) + len(unknown)
    _count_outcomes(cluster.slug, submitted=len(submitted), retry=retry, total=len(outcome))
    for pk, result in outcome.items():
        if isinstance(result, BackendError) and not isinstance(result, BackendUnavailable):
            job_finish(job_id=pk, status=None, reject_reason=str(result)[:200])
    if again or unknown:
        # Refused for now (sbatch exited, so the retry may go at once: it asks find(token) first),
        # or cut off with its outcome unknown: that lease stays until it runs out, so that no
        # retry can overtake a submission still under way; the sweep takes the job up then.
        Job.objects.filter(pk__in=again).update(dispatch_lease_until=None)
        first = outcome[(again or unknown)[0]]
        detail = str(first) if first is not None else "the connection was cut during sbatch"
        cluster_mark_health(cluster=cluster, healthy=False, detail=detail)
        raise BackendUnavailable(f"{len(again) + len(unknown)} of {len(jobs)} jobs not submitted: {detail}")


def _count_outcomes(cluster: str, *, submitted: int, retry: int, total: int) -> None:
    for outcome, n in (("submitted", submitted), ("retry", retry), ("rejected", total - submitted - retry)):
        if n:
            metrics.dispatch_jobs.labels(cluster, outcome).inc(n)


def _scheduler_ids(backend: Backend, jobs: list[Job]) -> dict[int, str | BackendError | None]:
    """Per job: the scheduler's id (found by token for a job tried before, else submitted), a
    BackendError, or None when its outcome is unknown (Backend.submit_many)."""
    retried = [job for job in jobs if job.dispatch_attempts > 1]
    found = backend.find_many([_ref(job) for job in retried]) if retried else {}
    outcome: dict[int, str | BackendError | None] = {
        job.pk: found[job.token] for job in retried if job.token in found
    }
    fresh = [job for job in jobs if job.pk not in outcome]
    if not fresh:
        return outcome
    results = backend.submit_many([spec_of(job) for job in fresh])
    outcome.update(zip([job.pk for job in fresh], results, strict=True))
    return outcome


def _ref(job: Job) -> JobRef:
    """For find_many: a job counts only under its own account and identity (a job with a copied
    token under another is never adopted)."""
    return JobRef(backend_id="", token=job.token, account=job.tenant.slug, user=job.cluster_user)


def _save_submitted(backend: Backend, submitted: dict[int, str]) -> None:
    """Record the scheduler's ids: SUBMITTING → PENDING. A job cancelled (or ended) while it
    was being submitted keeps its id, and the scheduler's copy is cancelled: it must not live on."""
    now = timezone.now()
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update()
            .filter(pk__in=submitted)
            .only("pk", "state", "raw_state", "cluster_user", "attempt")
        )
        pending = [job for job in jobs if job.state == JobState.SUBMITTING]
        cancel = [job for job in jobs if job.state != JobState.SUBMITTING]
        events = [moved_event(job, JobState.PENDING, reason="submitted") for job in pending]
        JobEvent.objects.bulk_create(events)
        saved = {
            "backend_id": Case(
                *(When(pk=pk, then=Value(backend_id)) for pk, backend_id in submitted.items())
            ),
            "submitted_at": now,
            "dispatch_lease_until": None,
        }
        Job.objects.filter(pk__in=[job.pk for job in pending]).update(
            state=JobState.PENDING, reason="submitted", **saved
        )
        Job.objects.filter(pk__in=[job.pk for job in cancel]).update(**saved)
    for job in cancel:
        try:
            backend.cancel(submitted[job.pk], user=job.cluster_user)
        except BackendUnavailable:
            send_now("jobs.tasks.cancel_job", job_id=job.pk, backend_id=submitted[job.pk])


# --- Sweep


def jobs_sweep() -> int:
    """Re-send what a lost message left behind (broker down, worker killed): admitted QUEUED
    jobs and SUBMITTING jobs whose lease ran out, and admission on partitions with waiting jobs.
    The database is the source of truth, not the queue. Returns how many were re-sent."""
    now = timezone.now()
    stale = Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now)
    # Clusters whose breaker is open and cooling off are left alone: their jobs wait, and go
    # when it closes (jobs_dispatch_resume) or at the first sweep after its cool-off.
    cooling = breakers_cooling(cluster_ids=set(Cluster.objects.values_list("pk", flat=True)))
    resend = list(
        Job.objects.filter(stale)
        .filter(Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING))
        .exclude(cluster_id__in=cooling)
        .values_list("pk", flat=True)
    )
    for job_id in resend:
        send_now("jobs.tasks.dispatch_job", job_id=job_id)
    for cluster_id in cooling:
        jobs_hold_for_cluster(cluster_id=cluster_id)  # they say why they wait
    waiting = Job.objects.filter(state=JobState.QUEUED, holds_gpus=False).values_list(
        "partition_id", flat=True
    )
    for partition_id in set(waiting):
        jobs_admit(partition_id=partition_id)
    cancelling = Job.objects.filter(state=JobState.CANCELLING).exclude(cluster_id__in=cooling)
    for job in cancelling.filter(stale, backend_id="").select_related("cluster", "tenant"):
        _cancel_unsubmitted(job)
    # A cancel whose message was lost: ask again (scancel of an ended job is a no-op).
    for job_id in cancelling.exclude(backend_id="").values_list("pk", flat=True):
        send_now("jobs.tasks.cancel_job", job_id=job_id)
    jobs_stop_overdue()
    return len(resend)


def _cancel_unsubmitted(job: Job) -> None:
    """A job cancelled while being submitted, whose dispatcher died: it may or may not have
    reached the scheduler. Ask by token, and cancel it there or end it here."""
    backend = backend_of(job.cluster)
    try:
        found = backend.find(job.token, account=job.tenant.slug, user=job.cluster_user)
        if found:
            Job.objects.filter(pk=job.pk).update(backend_id=found)
            backend.cancel(found, user=job.cluster_user)
            return
    except BackendUnavailable:
        return  # the next sweep asks again
    reason = "cancelled before it reached the scheduler"
    job_finish(
        job_id=job.pk, status=JobStatus(backend_id="", state=JobState.CANCELLED, raw_state="", reason=reason)
    )
