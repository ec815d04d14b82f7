"""Submit and admit (DESIGN.md, Flow of one job, steps 1 and 2). Locks are taken in one order,
the partition first and several grants in id order, so that submission, admission and
settlement never deadlock: an end locks partition → jobs → grants; admission locks partition →
grants and then writes the waiting jobs, which nobody locks without the partition's lock (a
submission inserts its job and locks only its grant). Partition and grant rows are locked FOR
NO KEY UPDATE: admission and the ledger still serialise on them, and a submission may meanwhile
insert a job that refers to them (the foreign key's check takes FOR KEY SHARE, which a plain
FOR UPDATE would make wait)."""

import contextlib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from clusters.models import Cluster, GpuModel, JobIdentity, Partition, Scenario
from jobs import admission
from jobs.job_templates import TemplateInvalid, render_template
from jobs.models import Job, JobEvent, JobState, Priority
from jobs.services.common import _send, log
from portal.core.errors import Conflict, Invalid
from portal.core.services import audit_record
from tenants.errors import NoQuota, QuotaExhausted, TenantSuspended
from tenants.models import QuotaGrant, Tenant, TenantState, Tier
from tenants.selectors import job_identity_of
from tenants.services import grant_reserve, grant_settle, grant_take_gpus

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
    if len(candidates) == 1:
        return candidates[0]
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


def _matching_grants(request: JobRequest):
    today = timezone.localdate()
    return QuotaGrant.objects.filter(
        tenant=request.tenant,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        starts_on__lte=today,
        ends_on__gte=today,
    )


def _reserve_errors(request: JobRequest, hours: Decimal) -> None:
    """Why no grant can take the job: none matches, or none allows its GPUs at once."""
    matching = _matching_grants(request)
    if not matching.exists():
        raise NoQuota(
            f"{request.tenant.slug} has no active grant for {request.scenario.slug} "
            f"on {request.gpu_model.slug}.",
            extra={"gpu_hours_requested": str(hours)},
        )
    if not matching.filter(gpus__gte=request.gpus).exists():
        largest = max(matching.values_list("gpus", flat=True))
        raise QuotaExhausted(
            f"{request.gpus} GPUs asked; the tenant's grants allow at most {largest} at once.",
            extra={"gpus_requested": request.gpus, "gpus_granted": largest},
        )


def _reserve(request: JobRequest, hours: Decimal) -> QuotaGrant:
    """Reserve on the matching active grant that ends first and still has the hours. Grants
    whose concurrent limit is below the job's GPUs are no match: the job would wait forever."""
    grants = list(_matching_grants(request).filter(gpus__gte=request.gpus).order_by("ends_on", "id"))
    if not grants:
        _reserve_errors(request, hours)
    for grant in grants:
        try:
            grant_reserve(grant_id=grant.pk, gpu_hours=hours)
        except QuotaExhausted as exc:
            exhausted = exc
        else:
            return grant
    raise exhausted


@dataclass(frozen=True)
class JobPreview:
    """What a submission would become, checked as job_submit checks it, with nothing written."""

    partition: Partition
    script: str
    env: dict[str, str]
    gpu_hours: Decimal
    cpus_per_gpu: int
    mem_per_gpu_mb: int
    priority: str
    gpu_hours_left: Decimal


def _checked(request: JobRequest) -> tuple[Partition, str]:
    """What submit and preview check before any grant: the tenant may submit, the env, the
    partition (picked), the job's shape on it, and the script (rendered)."""
    if request.tenant.state != TenantState.ACTIVE:
        raise TenantSuspended(f"Tenant {request.tenant.slug} is suspended: it can read but not submit.")
    _check_env(request.env)
    partition = _pick_partition(request)
    _check_shape(request, partition)
    return partition, _script(request, partition)


def job_preview(*, request: JobRequest) -> JobPreview:
    """The submit form's live check: the same validation, partition choice and script as
    job_submit, and the grant it would reserve on (read, not locked). Raises what job_submit
    would raise for the same input, so that the form shows it before the person submits."""
    partition, script = _checked(request)
    hours = _gpu_hours(request)
    grants = _matching_grants(request).filter(gpus__gte=request.gpus)
    left = max((grant.gpu_hours_remaining for grant in grants), default=None)
    if left is None:
        _reserve_errors(request, hours)
    elif hours > left:
        raise QuotaExhausted(f"{hours} GPU-hours asked, {left} left on the grant.")
    return JobPreview(
        partition=partition, script=script, env={**request.scenario.env, **request.env}, gpu_hours=hours,
        cpus_per_gpu=_cpus(request, partition), mem_per_gpu_mb=_mem(request, partition),
        priority=_priority(request), gpu_hours_left=left,
    )  # fmt: skip


def _cluster_user(request: JobRequest, cluster: Cluster, user: AbstractBaseUser) -> str:
    """Whom the job will run as on its cluster (tenants.selectors.job_identity_of), fixed now so
    that its sbatch, scancel and log are that identity's whatever changes later; a 400 naming
    the cluster when there is none: never the portal's service user instead."""
    name = job_identity_of(cluster=cluster, tenant=request.tenant, user=user)
    if name is not None:
        return name
    if cluster.job_identity == JobIdentity.USER:
        why = f"{cluster.name} runs jobs as your own cluster username, and your profile names none"
    else:
        why = f"{request.tenant.slug} has no usable cluster account on {cluster.name}"
    raise Invalid({"cluster": f"{why}: a platform admin sets it up."})


def _gpu_hours(request: JobRequest) -> Decimal:
    return (Decimal(request.gpus * request.walltime_minutes) / 60).quantize(Decimal("0.01"), ROUND_CEILING)


def _cpus(request: JobRequest, partition: Partition) -> int:
    return min(request.scenario.cpus_per_gpu, partition.max_cpus_per_gpu or math.inf)


def _mem(request: JobRequest, partition: Partition) -> int:
    return min(request.scenario.mem_per_gpu_mb, partition.max_mem_per_gpu_mb or math.inf)


def _earlier(user: AbstractBaseUser, idempotency_key: str, digest: str) -> Job | None:
    earlier = Job.objects.filter(submitted_by=user, idempotency_key=idempotency_key).first()
    if earlier is not None and earlier.request_digest != digest:
        raise Conflict("This Idempotency-Key was used with a different request.")
    return earlier


def job_submit(
    *, user: AbstractBaseUser, request: JobRequest, idempotency_key: str = "", digest: str = ""
) -> tuple[Job, bool]:
    """A QUEUED job with GPUs × walltime reserved on the tenant's grant, then admission on its
    partition: at once when its GPUs are free (dispatch follows) or left waiting with reason
    quota_wait or capacity_wait. Should another submission or end be admitting on the partition
    at that moment, the admit task does it right after (jobs_admit_soon). Returns (job,
    created): a repeated Idempotency-Key returns the first job."""
    if idempotency_key and (earlier := _earlier(user, idempotency_key, digest)):
        return earlier, False
    try:
        job = _submit(user=user, request=request, idempotency_key=idempotency_key, digest=digest)
    except IntegrityError:
        # The same key from the same user at the same instant: the other request won, and this
        # one's transaction (its reservation included) rolled back whole.
        earlier = _earlier(user, idempotency_key, digest) if idempotency_key else None
        if earlier is None:
            raise
        return earlier, False
    try:
        jobs_admit_soon(partition_id=job.partition_id, job=job)
    except DatabaseError as exc:  # the job is stored: its answer must not be a 500 a client retries
        log.warning(
            "admission after job %s failed, left to the admit task: %s", job.pk, exc.__class__.__name__
        )
        _send("jobs.tasks.admit_partition", partition_id=job.partition_id)
    return job, True


@transaction.atomic
def _submit(*, user: AbstractBaseUser, request: JobRequest, idempotency_key: str, digest: str) -> Job:
    """The job, its reservation (the grant's row lock), event and audit, in one transaction that
    takes no partition lock: submissions to one partition do not wait for each other."""
    partition, script = _checked(request)
    cluster_user = _cluster_user(request, partition.cluster, user)
    hours = _gpu_hours(request)
    grant = _reserve(request, hours)
    cpus, mem = _cpus(request, partition), _mem(request, partition)
    job = Job.objects.create(
        tenant=request.tenant,
        submitted_by=user,
        name=request.name,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        grant=grant,
        cluster=partition.cluster,
        cluster_user=cluster_user,
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
    return job


# --- Admission


def job_held_back(job: Job, *, grant: QuotaGrant, today: date) -> str:
    """Why the job's own tenant holds it back from starting, or "": a suspended tenant
    (tenant_suspended) or a grant no longer active (grant_ended). Admission and dispatch both
    ask, so that neither starts work that the cleanup (jobs/services/cleanup.py) would stop."""
    if job.tenant.state != TenantState.ACTIVE:
        return "tenant_suspended"
    if not grant.is_active_on(today):
        return "grant_ended"
    return ""


def job_unadmit_if_held(job: Job) -> bool:
    """Dispatch's check: an admitted QUEUED job whose tenant was suspended or whose grant ended
    since admission gives its GPUs back and waits again with that reason, never submitted. The
    caller holds the job's lock; the grant's is taken after it (partition → job → grant)."""
    held = job_held_back(job, grant=QuotaGrant.objects.get(pk=job.grant_id), today=timezone.localdate())
    if not held:
        return False
    grant_settle(
        grant_id=job.grant_id, reserved_gpu_hours=Decimal(0), used_gpu_hours=Decimal(0), gpus=job.gpus
    )
    job.holds_gpus, job.reason, job.dispatch_lease_until = False, held, None
    job.save(update_fields=["holds_gpus", "reason", "dispatch_lease_until"])
    partition_id = job.partition_id
    transaction.on_commit(lambda: jobs_admit_soon(partition_id=partition_id))  # its GPUs go to the next
    return True


def _admit(partition: Partition, new: Job | None = None) -> list[int]:
    """Give free GPUs to waiting jobs in admission order; the caller holds the partition lock.

    A job held back by its own tenant (a full grant, a suspended tenant, an ended grant) is
    skipped; the first that waits for the partition's capacity stops the line. With no GPU
    free nobody can start, and only the jobs that have no reason yet (just submitted) get one:
    `new` alone when given (a submission's own job, which then holds what the pass decided)."""
    free = partition.gpus_total - admission.gpus_held_on(partition.pk)
    if free <= 0:
        _mark_waiting(partition, new)
        return []
    waiting = admission.waiting_on(partition.pk)
    # Every grant this pass may touch, locked in one statement in id order: two admissions on
    # partitions that share a grant then queue on it instead of deadlocking.
    locked = (
        QuotaGrant.objects.select_for_update(no_key=True)
        .filter(pk__in={j.grant_id for j in waiting})
        .order_by("pk")
    )
    grants = {grant.pk: grant for grant in locked}
    today = timezone.localdate()
    admitted = []
    for job in admission.admission_order(waiting):
        before = job.reason
        grant = grants[job.grant_id]
        if held := job_held_back(job, grant=grant, today=today):
            job.reason = held
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
            Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                reason=job.reason, holds_gpus=job.holds_gpus
            )
    for job_id in admitted:
        _send("jobs.tasks.dispatch_job", job_id=job_id)
    if new is not None and (decided := next((job for job in waiting if job.pk == new.pk), None)):
        new.holds_gpus, new.reason = decided.holds_gpus, decided.reason
    return admitted


def _mark_waiting(partition: Partition, new: Job | None) -> None:
    """The reasons _admit would give, with no GPU free, to the waiting jobs that have none:
    held back by their tenant, quota_wait on a full grant, else capacity_wait. For a
    submission's own job, one UPDATE from the tenant and grant the submission read."""
    today = timezone.localdate()
    if new is not None:
        new.reason = _waiting_reason(new, today)
        Job.objects.filter(pk=new.pk, state=JobState.QUEUED, holds_gpus=False, reason="").update(
            reason=new.reason
        )
        return
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(partition_id=partition.pk, state=JobState.QUEUED, holds_gpus=False, reason="")
        .select_related("tenant", "grant")
    )
    for job in jobs:
        job.reason = _waiting_reason(job, today)
        job.save(update_fields=["reason"])


def _waiting_reason(job: Job, today: date) -> str:
    quota_full = job.grant.gpus_in_use + job.gpus > job.grant.gpus
    return job_held_back(job, grant=job.grant, today=today) or (
        admission.QUOTA_WAIT if quota_full else admission.CAPACITY_WAIT
    )


@transaction.atomic
def jobs_admit(*, partition_id: int) -> list[int]:
    """Admit what fits on the partition now; returns the admitted job ids."""
    return _admit(
        Partition.objects.select_for_update(no_key=True, of=("self",))
        .select_related("cluster")
        .get(pk=partition_id)
    )


# How long a sent admit task stands for the partition's next pass: submissions meanwhile send none.
ADMIT_PENDING_S = 30


def jobs_admit_soon(*, partition_id: int, job: Job | None = None) -> None:
    """Admission on the partition after a submission or an end: here and now when nobody else
    holds the partition (a submission's `job` then holds its outcome), else (another submission
    or end is admitting there) by the admit task, which waits for the lock and then sees what
    changed. One such task at a time per partition: the first to find the partition busy sends
    it, and the task clears the mark as it starts. A mark whose task was lost runs out after
    ADMIT_PENDING_S; the sweep admits meanwhile."""
    with transaction.atomic():
        partition = (
            Partition.objects.select_for_update(no_key=True, of=("self",), skip_locked=True)
            .select_related("cluster")
            .filter(pk=partition_id)
            .first()
        )
        if partition is not None:
            _admit(partition, new=job)
            return
    try:
        first = cache.add(admit_mark(partition_id), 1, ADMIT_PENDING_S)
    except Exception as exc:  # the cache's own errors (Redis down) differ by backend
        log.warning("admit mark unavailable, sending the admit task anyway: %s", exc.__class__.__name__)
        first = True
    if first:
        _send("jobs.tasks.admit_partition", partition_id=partition_id)


def jobs_admit_marked(*, partition_id: int) -> list[int]:
    """What the admit task runs: the mark goes first, so that a submission from now on sends
    another task if it needs one, then the pass (waiting for the partition's lock)."""
    with contextlib.suppress(Exception):  # the cache's own errors differ; the mark runs out anyway
        cache.delete(admit_mark(partition_id))
    return jobs_admit(partition_id=partition_id)


def admit_mark(partition_id: int) -> str:
    return f"jobs:admit-pending:{partition_id}"
