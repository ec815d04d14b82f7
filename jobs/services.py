"""Every write about jobs: submit, admit, dispatch, follow, cancel, settle (DESIGN.md, Flow of
one job). Locks are always taken in one order, partition → job → grant, so that submission,
admission and settlement on a busy partition never deadlock one another."""

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import ROUND_CEILING, Decimal

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from clusters.backends.base import (
    BackendError,
    BackendUnavailable,
    JobRef,
    JobSpec,
    JobStatus,
    LogTail,
    TenantLimits,
)
from clusters.models import Cluster, GpuModel, Partition, Scenario
from clusters.services import backend_of, cluster_mark_health
from jobs import admission
from jobs.job_templates import TemplateInvalid, render_template
from jobs.models import Job, JobEvent, JobState, Priority
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES, check_move
from portal.core.errors import Conflict, Invalid, Unavailable
from portal.core.services import audit_record
from tenants.errors import NoQuota, QuotaExhausted, TenantSuspended
from tenants.models import QuotaGrant, Tenant, TenantState, Tier
from tenants.services import grant_reserve, grant_settle, grant_take_gpus

log = logging.getLogger(__name__)

# A tenant's tier caps the priority its jobs may ask for within it.
MAX_PRIORITY = {
    Tier.LOW: Priority.LOW,
    Tier.NORMAL: Priority.NORMAL,
    Tier.HIGH: Priority.HIGH,
    Tier.CRITICAL: Priority.HIGH,
}
PRIORITY_ORDER = [Priority.LOW, Priority.NORMAL, Priority.HIGH]
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by the portal or the scheduler: a job may not override them.
RESERVED_ENV = re.compile(
    r"^(CUDA_VISIBLE_DEVICES|SLURM_\w*|PORTAL_\w*|LD_PRELOAD|LD_LIBRARY_PATH|PATH|HOME)$"
)
MAX_ENV = 64
MAX_SCRIPT_BYTES = 64 * 1024


@dataclass(frozen=True)
class JobRequest:
    """What a submitter asks for, parsed; the API builds it from the body."""

    tenant: Tenant
    scenario: Scenario
    gpu_model: GpuModel
    gpus: int
    walltime_minutes: int
    name: str
    nodes: int = 1
    priority: str = ""  # "": normal, or the tenant's tier cap if that is lower
    env: dict[str, str] = field(default_factory=dict)
    script: str = ""
    template: str = ""
    parameters: dict = field(default_factory=dict)
    cluster: Cluster | None = None
    partition: str = ""


def request_digest(body: dict) -> str:
    """The fingerprint an Idempotency-Key is bound to: the same key with another body is a conflict."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _send(task: str, **kwargs) -> None:
    """Enqueue after commit. By name: tasks import services, so services must not import tasks."""
    transaction.on_commit(lambda: _send_now(task, **kwargs))


def _send_now(task: str, **kwargs) -> None:
    current_app.send_task(task, kwargs=kwargs)


def _move(job: Job, to_state: str, *, reason: str = "", raw_state: str = "") -> None:
    """Change the job's state in memory and record the event; the caller saves the job."""
    check_move(job.state, to_state)
    JobEvent.objects.create(
        job=job, from_state=job.state, to_state=to_state, reason=reason, raw_state=raw_state
    )
    job.state, job.reason, job.raw_state = to_state, reason, raw_state or job.raw_state


# --- Submit


def _check_env(env: dict) -> dict[str, str]:
    errors = []
    if len(env) > MAX_ENV:
        errors.append(f"At most {MAX_ENV} variables.")
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            errors.append(f"{name!r} is not a valid variable name.")
        elif RESERVED_ENV.fullmatch(name):
            errors.append(f"{name} is set by the portal or the scheduler.")
        if not isinstance(value, str) or "\x00" in value or len(value) > 4096:
            errors.append(f"The value of {name!r} must be a string of at most 4096 characters.")
    if errors:
        raise Invalid({"env": errors})
    return env


def _pick_partition(request: JobRequest) -> Partition:
    """The partition given, or of those with the GPU model the one with most free GPUs."""
    candidates = Partition.objects.filter(gpu_model=request.gpu_model, cluster__enabled=True).select_related(
        "cluster"
    )
    if request.cluster is not None:
        candidates = candidates.filter(cluster=request.cluster)
    if request.partition:
        candidates = candidates.filter(name=request.partition)
    candidates = list(candidates)
    if not candidates:
        field_name = "partition" if request.partition else "cluster" if request.cluster else "gpu_model"
        raise Invalid({field_name: f"No enabled partition offers {request.gpu_model.slug} here."})
    free = {p.pk: p.gpus_total - admission.gpus_held_on(p.pk) for p in candidates}
    return max(candidates, key=lambda p: (p.cluster.healthy, free[p.pk], -p.pk))


def _check_shape(request: JobRequest, partition: Partition) -> None:
    errors = {}
    if request.gpus % request.nodes:
        errors["gpus"] = f"{request.gpus} GPUs do not divide evenly over {request.nodes} nodes."
    elif request.gpus // request.nodes > partition.gpus_per_node:
        errors["gpus"] = f"{partition} has {partition.gpus_per_node} GPUs per node."
    if request.nodes > partition.nodes:
        errors["nodes"] = f"{partition} has {partition.nodes} nodes."
    cap = min(partition.max_walltime_minutes, settings.JOB_MAX_WALLTIME_MINUTES)
    if request.walltime_minutes > cap:
        errors["walltime_minutes"] = f"At most {cap} minutes on {partition}."
    tier_cap = MAX_PRIORITY[request.tenant.tier]
    if request.priority and PRIORITY_ORDER.index(request.priority) > PRIORITY_ORDER.index(tier_cap):
        errors["priority"] = f"A {request.tenant.tier}-tier tenant's jobs go up to {tier_cap}."
    if errors:
        raise Invalid(errors)


def _priority(request: JobRequest) -> str:
    """The priority asked for, or normal capped by the tenant's tier when none was."""
    if request.priority:
        return request.priority
    cap = MAX_PRIORITY[request.tenant.tier]
    return min(Priority.NORMAL, cap, key=PRIORITY_ORDER.index)


def _script(request: JobRequest, partition: Partition) -> str:
    if bool(request.script) == bool(request.template):
        raise Invalid({"script": "Give either a script or a template with parameters."})
    if request.template:
        try:
            return render_template(
                request.template,
                request.parameters,
                nodes=request.nodes,
                gpus_per_node=request.gpus // request.nodes,
                backend_kind=partition.cluster.kind,
            )
        except TemplateInvalid as exc:
            raise Invalid(exc.errors) from None
    if not request.script.startswith("#!") or "\x00" in request.script:
        raise Invalid({"script": "A batch script starts with #! (e.g. #!/bin/bash) and holds no NUL byte."})
    if len(request.script.encode()) > MAX_SCRIPT_BYTES:
        raise Invalid({"script": f"At most {MAX_SCRIPT_BYTES} bytes."})
    return request.script


def _reserve(request: JobRequest, hours: Decimal) -> QuotaGrant:
    """Reserve on the matching active grant that ends first and still has the hours. Grants
    whose concurrent limit is below the job's GPUs are no match: the job would wait forever."""
    today = timezone.localdate()
    matching = QuotaGrant.objects.filter(
        tenant=request.tenant,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        starts_on__lte=today,
        ends_on__gte=today,
    )
    if not matching.exists():
        raise NoQuota(
            f"{request.tenant.slug} has no active grant for {request.scenario.slug} "
            f"on {request.gpu_model.slug}.",
            extra={"gpu_hours_requested": str(hours)},
        )
    grants = list(matching.filter(gpus__gte=request.gpus).order_by("ends_on", "id"))
    if not grants:
        largest = max(matching.values_list("gpus", flat=True))
        raise QuotaExhausted(
            f"{request.gpus} GPUs asked; the tenant's grants allow at most {largest} at once.",
            extra={"gpus_requested": request.gpus, "gpus_granted": largest},
        )
    for grant in grants:
        try:
            return grant_reserve(grant_id=grant.pk, gpu_hours=hours)
        except QuotaExhausted as exc:
            exhausted = exc
    raise exhausted


def _earlier(user: AbstractBaseUser, idempotency_key: str, digest: str) -> Job | None:
    earlier = Job.objects.filter(submitted_by=user, idempotency_key=idempotency_key).first()
    if earlier is not None and earlier.request_digest != digest:
        raise Conflict("This Idempotency-Key was used with a different request.")
    return earlier


def job_submit(
    *, user: AbstractBaseUser, request: JobRequest, idempotency_key: str = "", digest: str = ""
) -> tuple[Job, bool]:
    """A QUEUED job with GPUs × walltime reserved on the tenant's grant, admitted at once when
    its GPUs are free (dispatch follows on commit) or left waiting with reason quota_wait or
    capacity_wait. Returns (job, created): a repeated Idempotency-Key returns the first job."""
    if idempotency_key and (earlier := _earlier(user, idempotency_key, digest)):
        return earlier, False
    try:
        return _submit(user=user, request=request, idempotency_key=idempotency_key, digest=digest), True
    except IntegrityError:
        # The same key from the same user at the same instant: the other request won, and this
        # one's transaction (its reservation included) rolled back whole.
        earlier = _earlier(user, idempotency_key, digest) if idempotency_key else None
        if earlier is None:
            raise
        return earlier, False


@transaction.atomic
def _submit(*, user: AbstractBaseUser, request: JobRequest, idempotency_key: str, digest: str) -> Job:
    if request.tenant.state != TenantState.ACTIVE:
        raise TenantSuspended(f"Tenant {request.tenant.slug} is suspended: it can read but not submit.")
    _check_env(request.env)
    partition = _pick_partition(request)
    _check_shape(request, partition)
    script = _script(request, partition)
    # Lock order: the partition first (admission serializes on it), then the grant.
    partition = Partition.objects.select_for_update().select_related("cluster").get(pk=partition.pk)
    hours = (Decimal(request.gpus * request.walltime_minutes) / 60).quantize(Decimal("0.01"), ROUND_CEILING)
    grant = _reserve(request, hours)
    cpus = min(request.scenario.cpus_per_gpu, partition.max_cpus_per_gpu or math.inf)
    mem = min(request.scenario.mem_per_gpu_mb, partition.max_mem_per_gpu_mb or math.inf)
    job = Job.objects.create(
        tenant=request.tenant,
        submitted_by=user,
        name=request.name,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        grant=grant,
        cluster=partition.cluster,
        partition=partition,
        gpus=request.gpus,
        nodes=request.nodes,
        walltime_minutes=request.walltime_minutes,
        priority=_priority(request),
        cpus_per_gpu=cpus,
        mem_per_gpu_mb=mem,
        env={**request.scenario.env, **request.env},
        script=script,
        template=request.template,
        parameters=request.parameters,
        reserved_gpu_hours=hours,
        idempotency_key=idempotency_key,
        request_digest=digest,
    )
    JobEvent.objects.create(job=job, from_state="", to_state=JobState.QUEUED, reason="submitted")
    audit_record(
        actor=user,
        action="job.submit",
        target=job,
        tenant=request.tenant,
        data={"gpus": job.gpus, "gpu_model": request.gpu_model.slug, "gpu_hours_reserved": str(hours)},
    )
    _admit(partition)
    job.refresh_from_db()
    return job


# --- Admission


def _admit(partition: Partition) -> list[int]:
    """Give free GPUs to waiting jobs in admission order; the caller holds the partition lock.

    A job held back by its own tenant (a full grant, a suspended tenant, an ended grant) is
    skipped; the first that waits for the partition's capacity stops the line."""
    waiting = admission.waiting_on(partition.pk)
    # Every grant this pass may touch, locked in one statement in id order: two admissions on
    # partitions that share a grant then queue on it instead of deadlocking.
    locked = (
        QuotaGrant.objects.select_for_update().filter(pk__in={j.grant_id for j in waiting}).order_by("pk")
    )
    grants = {grant.pk: grant for grant in locked}
    today = timezone.localdate()
    free = partition.gpus_total - admission.gpus_held_on(partition.pk)
    admitted = []
    for job in admission.admission_order(waiting):
        before = job.reason
        grant = grants[job.grant_id]
        if job.tenant.state != TenantState.ACTIVE:
            job.reason = "tenant_suspended"
        elif not grant.is_active_on(today):
            job.reason = "grant_ended"
        elif grant.gpus_in_use + job.gpus > grant.gpus:
            job.reason = admission.QUOTA_WAIT
        elif job.gpus > free:
            job.reason = admission.CAPACITY_WAIT
            free = 0  # strict order: nobody passes a job that waits for capacity
        elif not grant_take_gpus(grant_id=job.grant_id, gpus=job.gpus):
            job.reason = admission.QUOTA_WAIT
        else:
            grant.gpus_in_use += job.gpus
            free -= job.gpus
            job.holds_gpus, job.reason = True, ""
            admitted.append(job.pk)
        if job.holds_gpus or job.reason != before:
            job.save(update_fields=["reason", "holds_gpus"])
    for job_id in admitted:
        _send("jobs.tasks.dispatch_job", job_id=job_id)
    return admitted


@transaction.atomic
def jobs_admit(*, partition_id: int) -> list[int]:
    """Admit what fits on the partition now; returns the admitted job ids."""
    return _admit(Partition.objects.select_for_update().select_related("cluster").get(pk=partition_id))


# --- Dispatch


def _claim(job_id: int) -> Job | None:
    """Take the dispatch lease of an admitted QUEUED job (→ SUBMITTING) or of a SUBMITTING job
    whose last dispatcher is gone. One conditional UPDATE: of two dispatchers, one wins."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.JOB_DISPATCH_LEASE_S)
    claimable = Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING)
    expired = Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now)
    if not Job.objects.filter(claimable & expired, pk=job_id).update(
        dispatch_lease_until=lease, dispatch_attempts=F("dispatch_attempts") + 1
    ):
        return None
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .select_related("cluster", "partition", "gpu_model", "tenant")
            .get(pk=job_id)
        )
        if job.state == JobState.QUEUED:
            _move(job, JobState.SUBMITTING)
            job.save(update_fields=["state", "reason", "raw_state"])
        elif job.state != JobState.SUBMITTING:
            return None  # cancelled or ended between the lease and the lock: nothing to submit
    return job


def _spec(job: Job) -> JobSpec:
    return JobSpec(
        token=job.token,
        name=job.name,
        account=job.tenant.slug,
        qos=f"portal-{job.tenant.tier}",
        priority=job.priority,
        partition=job.partition.name,
        gpu_type=job.gpu_model.slurm_gres,
        k8s_resource=job.gpu_model.k8s_resource,
        k8s_product=job.gpu_model.k8s_product,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        walltime_minutes=job.walltime_minutes,
        script=job.script,
        env=dict(job.env),
        cpus_per_gpu=job.cpus_per_gpu,
        mem_per_gpu_mb=job.mem_per_gpu_mb,
        labels={"tenant": job.tenant.slug, "job": str(job.pk), "scenario": job.scenario.slug},
    )


def job_dispatch(*, job_id: int) -> None:
    """QUEUED (admitted) → SUBMITTING → PENDING. Safe to run twice and after a crash anywhere:
    the lease lets one dispatcher work at a time, and any attempt after the first asks the
    scheduler for the job's token before it submits again."""
    job = _claim(job_id)
    if job is None:
        return
    backend = backend_of(job.cluster)
    try:
        backend_id = (backend.find(job.token) if job.dispatch_attempts > 1 else None) or backend.submit(
            _spec(job)
        )
    except BackendUnavailable as exc:
        cluster_mark_health(cluster=job.cluster, healthy=False, detail=str(exc))
        Job.objects.filter(pk=job_id).update(dispatch_lease_until=None)  # the retry may go at once
        raise
    except BackendError as exc:
        job_finish(job_id=job_id, status=None, reject_reason=str(exc)[:200])
        return
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        job.backend_id, job.submitted_at, job.dispatch_lease_until = backend_id, timezone.now(), None
        if job.state == JobState.SUBMITTING:
            _move(job, JobState.PENDING, reason="submitted")
            job.save()
            return
        job.save()
    # Cancelled (or ended) while sbatch ran: the scheduler's copy must not live on.
    try:
        backend.cancel(backend_id)
    except BackendUnavailable:
        _send_now("jobs.tasks.cancel_job", job_id=job_id, backend_id=backend_id)


# --- Follow


def jobs_poll(*, cluster_id: int) -> int:
    """One poll of one cluster for all its active jobs; returns how many changed state."""
    cluster = Cluster.objects.get(pk=cluster_id)
    active = Job.objects.filter(cluster=cluster, state__in=ACTIVE_IN_SCHEDULER).exclude(backend_id="")
    jobs = {row[0]: row[1:] for row in active.values_list("backend_id", "pk", "submitted_at")}
    if not jobs:
        return 0
    try:
        statuses = backend_of(cluster).poll(sorted(jobs))
    except BackendUnavailable as exc:
        cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
        return 0
    if not cluster.healthy:
        cluster_mark_health(cluster=cluster, healthy=True, detail="answers")
    moved = sum(job_apply_status(job_id=jobs[bid][0], status=status) for bid, status in statuses.items())
    # Gone from the scheduler with no record, past a grace period for its bookkeeping to catch
    # up: LOST, and its reservation and GPUs go back to the grant.
    grace = timezone.now() - timedelta(seconds=settings.JOB_LOST_GRACE_S)
    for backend_id, (pk, submitted_at) in jobs.items():
        if backend_id not in statuses and submitted_at and submitted_at < grace:
            lost = JobStatus(
                backend_id=backend_id, state=JobState.LOST, raw_state="", reason="unknown to the scheduler"
            )
            moved += job_finish(job_id=pk, status=lost)
    return moved


def job_apply_status(*, job_id: int, status: JobStatus) -> bool:
    """Follow what the scheduler says; an end state settles the job. True if the state moved."""
    if status.state in END_STATES:
        return job_finish(job_id=job_id, status=status)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in END_STATES:
            return False
        # A job being cancelled stays CANCELLING until the scheduler says it ended.
        moved = status.state != job.state and job.state != JobState.CANCELLING
        if moved:
            _move(job, status.state, reason=status.reason, raw_state=status.raw_state)
        elif job.state != JobState.CANCELLING:
            job.reason, job.raw_state = status.reason, status.raw_state  # e.g. Priority → Resources
        job.started_at = job.started_at or status.started_at
        job.node_list = status.node_list or job.node_list
        job.save()
    return moved


def job_finish(*, job_id: int, status: JobStatus | None, reject_reason: str = "") -> bool:
    """Any → an end state: charge the real GPU-hours (elapsed × GPUs) to the grant, release the
    reservation and the GPUs, record exit code and times, and admit the next waiting job."""
    with transaction.atomic():
        partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=job_id)
        Partition.objects.select_for_update().get(pk=partition_id)  # lock order: partition → job → grant
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in END_STATES:
            return False
        now = timezone.now()
        if status is None:
            _move(job, JobState.REJECTED, reason=reject_reason)
        else:
            _move(job, status.state, reason=status.reason, raw_state=status.raw_state)
            job.exit_code = status.exit_code
            job.started_at = job.started_at or status.started_at
            job.node_list = status.node_list or job.node_list
        job.finished_at = (status.finished_at if status else None) or now
        elapsed_h = (
            Decimal(max(0.0, (job.finished_at - job.started_at).total_seconds()) / 3600)
            if job.started_at
            else 0
        )
        job.gpu_hours = (Decimal(elapsed_h) * job.gpus).quantize(Decimal("0.0001"))
        grant_settle(
            grant_id=job.grant_id,
            reserved_gpu_hours=job.reserved_gpu_hours,
            used_gpu_hours=job.gpu_hours,
            gpus=job.gpus if job.holds_gpus else 0,
        )
        job.holds_gpus, job.dispatch_lease_until = False, None
        job.save()
        transaction.on_commit(lambda: jobs_admit(partition_id=partition_id))
    return True


# --- Cancel


def job_cancel(*, actor: AbstractBaseUser, job: Job) -> Job:
    """QUEUED → CANCELLED at once; SUBMITTING, PENDING or RUNNING → CANCELLING, and the
    scheduler is told (the poll confirms CANCELLED). An ended job is a conflict."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state in END_STATES:
            raise Conflict(f"Job {locked.pk} has already ended ({locked.state}).")
        audit_record(
            actor=actor, action="job.cancel", target=locked, tenant=job.tenant, data={"state": locked.state}
        )
        if locked.state in (JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING):
            _move(locked, JobState.CANCELLING, reason=f"cancelled by {actor.get_username()}")
            locked.save(update_fields=["state", "reason", "raw_state"])
            if locked.backend_id:
                _send("jobs.tasks.cancel_job", job_id=locked.pk)
    if locked.state == JobState.QUEUED:
        job_finish(
            job_id=job.pk,
            status=JobStatus(
                backend_id="",
                state=JobState.CANCELLED,
                raw_state="",
                reason=f"cancelled by {actor.get_username()}",
            ),
        )
    return Job.objects.get(pk=job.pk)


def job_cancel_in_scheduler(*, job_id: int, backend_id: str = "") -> None:
    """Tell the scheduler to cancel a CANCELLING job, or the given scheduler job of a job that
    ended while it was being submitted; BackendUnavailable is retried by the task."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if backend_id or (job.state == JobState.CANCELLING and job.backend_id):
        backend_of(job.cluster).cancel(backend_id or job.backend_id)


def job_log_tail(*, job: Job, lines: int) -> LogTail:
    """The last lines of the job's output; a scheduler that cannot be read answers Unavailable."""
    if not job.backend_id:
        return LogTail(lines=[], truncated=False)
    ref = JobRef(backend_id=job.backend_id, token=job.token, account=job.tenant.slug)
    try:
        return backend_of(job.cluster).log_tail(ref, lines=lines, max_bytes=settings.JOB_LOG_MAX_BYTES)
    except BackendError as exc:  # BackendUnavailable included
        log.warning("log of job %s unavailable: %s", job.pk, exc.__class__.__name__)
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.") from None


# --- Sweep


def jobs_sweep() -> int:
    """Re-send what a lost message left behind (broker down, worker killed): admitted QUEUED
    jobs and SUBMITTING jobs whose lease ran out, and admission on partitions with waiting jobs.
    The database is the source of truth, not the queue. Returns how many were re-sent."""
    now = timezone.now()
    stale = Q(dispatch_lease_until__isnull=True) | Q(dispatch_lease_until__lt=now)
    resend = list(
        Job.objects.filter(stale)
        .filter(Q(state=JobState.QUEUED, holds_gpus=True) | Q(state=JobState.SUBMITTING))
        .values_list("pk", flat=True)
    )
    for job_id in resend:
        current_app.send_task("jobs.tasks.dispatch_job", kwargs={"job_id": job_id})
    waiting = Job.objects.filter(state=JobState.QUEUED, holds_gpus=False).values_list(
        "partition_id", flat=True
    )
    for partition_id in set(waiting):
        jobs_admit(partition_id=partition_id)
    for job in Job.objects.filter(stale, state=JobState.CANCELLING, backend_id="").select_related("cluster"):
        _cancel_unsubmitted(job)
    # A cancel whose message was lost: ask again (scancel of an ended job is a no-op).
    for job_id in (
        Job.objects.filter(state=JobState.CANCELLING).exclude(backend_id="").values_list("pk", flat=True)
    ):
        _send_now("jobs.tasks.cancel_job", job_id=job_id)
    return len(resend)


def _cancel_unsubmitted(job: Job) -> None:
    """A job cancelled while being submitted, whose dispatcher died: it may or may not have
    reached the scheduler. Ask by token, and cancel it there or end it here."""
    backend = backend_of(job.cluster)
    try:
        found = backend.find(job.token)
        if found:
            Job.objects.filter(pk=job.pk).update(backend_id=found)
            backend.cancel(found)
            return
    except BackendUnavailable:
        return  # the next sweep asks again
    reason = "cancelled before it reached the scheduler"
    job_finish(
        job_id=job.pk, status=JobStatus(backend_id="", state=JobState.CANCELLED, raw_state="", reason=reason)
    )


# --- The schedulers' view of a tenant


def tenant_limits(*, tenant: Tenant, cluster: Cluster) -> TenantLimits:
    """The tenant's limits on one cluster, from its active grants for the GPU models there:
    concurrent GPUs per GRES type (GrpTRES) and the GPU-minutes granted (GrpTRESMins).

    Granted, not remaining: Slurm counts the account's usage itself (and lets it decay), so a
    limit of the remaining minutes would count every finished job twice and hold back jobs the
    portal's own ledger has admitted. The ledger is the exact limit; Slurm's is the backstop."""
    today = timezone.localdate()
    models_here = set(cluster.partitions.values_list("gpu_model_id", flat=True))
    gpus_by_type: dict[str, int] = {}
    k8s: dict[str, int] = {}
    minutes = Decimal(0)
    grants = QuotaGrant.objects.filter(tenant=tenant, starts_on__lte=today, ends_on__gte=today)
    grants = grants.select_related("gpu_model")
    if tenant.state == TenantState.ACTIVE:
        for grant in grants:
            if grant.gpu_model_id in models_here:
                gpu_type = grant.gpu_model.slurm_gres
                gpus_by_type[gpu_type] = gpus_by_type.get(gpu_type, 0) + grant.gpus
                k8s[grant.gpu_model.k8s_resource] = k8s.get(grant.gpu_model.k8s_resource, 0) + grant.gpus
                minutes += grant.gpu_hours * 60
    return TenantLimits(
        account=tenant.slug,
        qos=f"portal-{tenant.tier}",
        users=[cluster.ssh_user] if cluster.ssh_user else [],
        gpus_by_type=gpus_by_type,
        gpu_minutes=int(minutes),
        k8s_resources=k8s,
    )


def tenant_apply(*, tenant_id: int, cluster_id: int) -> TenantLimits:
    """Create or update the tenant's account and limits on one cluster. Idempotent."""
    tenant = Tenant.objects.get(pk=tenant_id)
    cluster = Cluster.objects.get(pk=cluster_id)
    limits = tenant_limits(tenant=tenant, cluster=cluster)
    backend_of(cluster).apply_tenant(limits)
    return limits
