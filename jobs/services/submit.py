"""Submit (docs/architecture.md, the flow of a job, step 1): check a request, reserve its
GPU-hours on a grant, store the QUEUED job, then hand it to admission (admission.py). A
submission locks only its grant's row and takes no partition lock, so submissions to one
partition do not wait for each other."""

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.models import Cluster, GpuModel, JobIdentity, Partition, Scenario, share_check, units_per_node
from clusters.shares import WHOLE, Share, ShareKind
from jobs.budgets import budget_check, budgets_notify_later
from jobs.job_templates import TemplateInvalid, render_template
from jobs.models import MAX_PRIORITY, Job, JobEvent, JobState, default_priority, priority_above_cap
from jobs.services.admission import gpus_held_on, jobs_admit_later
from portal.core.compiled import CompiledQuery
from portal.core.errors import Conflict, Invalid
from portal.core.services import audit_record
from tenants.errors import NoQuota, QuotaExhausted, TenantSuspended
from tenants.models import CohortMember, QuotaGrant, Tenant, TenantState
from tenants.selectors import job_identity_of
from tenants.services import grant_reserve

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by the portal or the scheduler: a job may not override them.
RESERVED_ENV = re.compile(
    r"^(CUDA_VISIBLE_DEVICES|SLURM_\w*|PORTAL_\w*|LD_PRELOAD|LD_LIBRARY_PATH|PATH|HOME)$"
)
MAX_ENV = 64
MAX_SCRIPT_BYTES = 64 * 1024
IDEMPOTENCY_KEY_MAX = 128


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
    share: Share = WHOLE  # what each of `gpus` is: a whole device unless the request says
    # May run on GPUs its tenant's cohort lends, and be stopped (warned first) when they are
    # reclaimed; restarted after PREEMPTED, NODE_FAIL or FAILED with one of restart_exit_codes,
    # up to max_restarts times (None: JOB_PREEMPTIBLE_RESTARTS for a preemptible job, else 0).
    preemptible: bool = False
    max_restarts: int | None = None
    restart_exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Idempotency:
    """A submission's Idempotency-Key and the fingerprint of the body it came with: the same
    key again with the same body answers the first job, with another body a conflict."""

    key: str
    digest: str


def _idempotency(key: str, body: dict | None) -> _Idempotency | None:
    """None without a key; a key longer than IDEMPOTENCY_KEY_MAX is a 400 naming the header."""
    if not key:
        return None
    if len(key) > IDEMPOTENCY_KEY_MAX:
        raise Invalid({"Idempotency-Key": f"At most {IDEMPOTENCY_KEY_MAX} characters."})
    digest = hashlib.sha256(json.dumps(body or {}, sort_keys=True, default=str).encode()).hexdigest()
    return _Idempotency(key, digest)


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
    """The partition given, or of those with the GPU model that offer the share the one with most
    free GPUs. A share the model has but no partition here offers is a 400 naming `share`."""
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
    offering = [p for p in candidates if p.offers(request.share.kind)]
    if not offering:
        if len(candidates) == 1:
            share_fraction(request, candidates[0])  # the partition's own words
        raise Invalid(
            {"share": f"No enabled partition offers {request.share.label} of {request.gpu_model.slug} here."}
        )
    candidates = offering
    if len(candidates) == 1:
        return candidates[0]
    free = {p.pk: p.gpus_total - gpus_held_on(p.pk) for p in candidates}
    return max(candidates, key=lambda p: (p.cluster.healthy, free[p.pk], -p.pk))


def share_fraction(request: JobRequest, partition: Partition) -> Decimal:
    """What each of the job's units counts of a device on the partition; a 400 naming the field
    when the partition cannot give the share."""
    try:
        return share_check(request.gpu_model, request.share, partition=partition)
    except ValidationError as exc:
        raise Invalid(exc.message_dict) from None


def _check_shape(request: JobRequest, partition: Partition) -> None:
    errors = {}
    per_node = units_per_node(partition, request.share)
    unit = "GPUs" if request.share.kind == ShareKind.WHOLE else f"{request.share.label} units"
    if request.gpus % request.nodes:
        errors["gpus"] = f"{request.gpus} {unit} do not divide evenly over {request.nodes} nodes."
    elif request.gpus // request.nodes > per_node:
        errors["gpus"] = f"{partition} has {per_node} {unit} per node."
    if request.nodes > partition.nodes:
        errors["nodes"] = f"{partition} has {partition.nodes} nodes."
    cap = min(partition.max_walltime_minutes, settings.JOB_MAX_WALLTIME_MINUTES)
    if request.walltime_minutes > cap:
        errors["walltime_minutes"] = f"At most {cap} minutes on {partition}."
    if request.max_restarts is not None and not 0 <= request.max_restarts <= settings.JOB_MAX_RESTARTS:
        errors["max_restarts"] = f"From 0 to {settings.JOB_MAX_RESTARTS}."
    if request.restart_exit_codes and not _max_restarts(request):
        errors["restart_exit_codes"] = "Restarting on an exit code needs max_restarts of 1 or more."
    if (
        any(not 1 <= code <= 255 for code in request.restart_exit_codes)
        or len(request.restart_exit_codes) > 8
    ):
        errors["restart_exit_codes"] = "At most 8 exit codes, each from 1 to 255."
    if request.priority and priority_above_cap(request.priority, request.tenant.tier):
        errors["priority"] = (
            f"A {request.tenant.tier}-tier tenant's jobs go up to {MAX_PRIORITY[request.tenant.tier]}."
        )
    if errors:
        raise Invalid(errors)


def _priority(request: JobRequest) -> str:
    """The priority asked for, or normal capped by the tenant's tier when none was."""
    return request.priority or default_priority(request.tenant.tier)


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
                vendor=request.gpu_model.vendor,
            )
        except TemplateInvalid as exc:
            raise Invalid(exc.errors) from None
    if not request.script.startswith("#!") or "\x00" in request.script:
        raise Invalid({"script": "A batch script starts with #! (e.g. #!/bin/bash) and holds no NUL byte."})
    if len(request.script.encode()) > MAX_SCRIPT_BYTES:
        raise Invalid({"script": f"At most {MAX_SCRIPT_BYTES} bytes."})
    return request.script


def _matching_grants(request: JobRequest):
    """The tenant's active grants in the job's unit: the scenario, the model and the share."""
    return QuotaGrant.objects.active_on(timezone.localdate()).filter(
        tenant=request.tenant,
        scenario=request.scenario,
        gpu_model=request.gpu_model,
        share=request.share.kind,
        mig_profile=request.share.mig_profile,
    )


def _reserve_errors(request: JobRequest, hours: Decimal) -> None:
    """Why no grant can take the job: none matches, or none allows its GPUs at once."""
    matching = _matching_grants(request)
    if not matching.exists():
        share = "" if request.share.kind == ShareKind.WHOLE else f" ({request.share.label})"
        raise NoQuota(
            f"{request.tenant.slug} has no active grant for {request.scenario.slug} "
            f"on {request.gpu_model.slug}{share}.",
            extra={"gpu_hours_requested": str(hours)},
        )
    if not _holding(request).exists():
        largest = max(matching.values_list("gpus", flat=True))
        raise QuotaExhausted(
            f"{request.gpus} GPUs asked; the tenant's grants allow at most {largest} at once.",
            extra={"gpus_requested": request.gpus, "gpus_granted": largest},
        )


def borrowing_reach(request: JobRequest) -> int:
    """How many GPUs a job may hold beyond its grant's concurrent limit: a preemptible job of
    whole devices, its tenant's borrowing limit in the model's cohort; else 0."""
    if not request.preemptible or request.share.kind != ShareKind.WHOLE:
        return 0
    limits = CohortMember.objects.filter(tenant=request.tenant, cohort__gpu_model=request.gpu_model)
    return max(limits.values_list("borrowing_limit", flat=True), default=0)


def _holding(request: JobRequest):
    """The matching grants whose concurrent limit, with what the job may borrow, holds it:
    others are no match, since the job would wait forever."""
    return _matching_grants(request).filter(gpus__gte=request.gpus - borrowing_reach(request))


def _reserve(request: JobRequest, hours: Decimal) -> QuotaGrant:
    """Reserve on the matching active grant that ends first and still has the hours."""
    grants = list(_holding(request).order_by("ends_on", "id"))
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
    device_fraction: Decimal


@dataclass(frozen=True)
class _Checked:
    partition: Partition
    script: str
    fraction: Decimal  # what each unit counts of a device there


def _checked(request: JobRequest) -> _Checked:
    """What submit and preview check before any grant: the tenant may submit, the env, the
    partition (picked), the share and the job's shape on it, and the script (rendered)."""
    if request.tenant.state != TenantState.ACTIVE:
        raise TenantSuspended(f"Tenant {request.tenant.slug} is suspended: it can read but not submit.")
    _check_env(request.env)
    partition = _pick_partition(request)
    fraction = share_fraction(request, partition)
    _check_shape(request, partition)
    return _Checked(partition, _script(request, partition), fraction)


def job_preview(*, request: JobRequest) -> JobPreview:
    """The submit form's live check: the same validation, partition choice and script as
    job_submit, and the grant it would reserve on (read, not locked). Raises what job_submit
    would raise for the same input, so that the form shows it before the person submits."""
    checked = _checked(request)
    partition, script, fraction = checked.partition, checked.script, checked.fraction
    hours = _gpu_hours(request, fraction)
    grants = _holding(request)
    left = max((grant.gpu_hours_remaining for grant in grants), default=None)
    if left is None:
        _reserve_errors(request, hours)
    elif hours > left:
        raise QuotaExhausted(f"{hours} GPU-hours asked, {left} left on the grant.")
    grant = next((g for g in grants.order_by("ends_on", "id") if g.gpu_hours_remaining >= hours), None)
    budget_check(tenant=request.tenant, grant=grant, gpu_model_id=request.gpu_model.pk,
                 share=request.share.kind, gpu_hours=hours, lock=False)  # fmt: skip
    return JobPreview(
        partition=partition, script=script, env={**request.scenario.env, **request.env}, gpu_hours=hours,
        cpus_per_gpu=_cpus(request, partition, fraction), mem_per_gpu_mb=_mem(request, partition, fraction),
        priority=_priority(request), gpu_hours_left=left, device_fraction=fraction,
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


def _gpu_hours(request: JobRequest, fraction: Decimal) -> Decimal:
    """Device-equivalent GPU-hours the job may use: units × fraction × walltime, rounded up."""
    units = request.gpus * fraction * request.walltime_minutes
    return (units / 60).quantize(Decimal("0.01"), ROUND_CEILING)


# A share of a device gets that share of a device's CPUs and memory, and at least these.
MIN_CPUS_PER_UNIT, MIN_MEM_PER_UNIT_MB = 1, 1024


def _cpus(request: JobRequest, partition: Partition, fraction: Decimal) -> int:
    per_gpu = min(request.scenario.cpus_per_gpu, partition.max_cpus_per_gpu or math.inf)
    return max(MIN_CPUS_PER_UNIT, int(per_gpu * fraction))


def _mem(request: JobRequest, partition: Partition, fraction: Decimal) -> int:
    per_gpu = min(request.scenario.mem_per_gpu_mb, partition.max_mem_per_gpu_mb or math.inf)
    return min(per_gpu, max(MIN_MEM_PER_UNIT_MB, int(per_gpu * fraction)))


# Every submission with an Idempotency-Key asks first whether it is a repeat: compiled once
# (portal.core.compiled); a repeat, the rare case, then loads its job.
_EARLIER = CompiledQuery(
    lambda user_id, key: (
        Job.objects.filter(submitted_by_id=user_id, idempotency_key=key)
        .order_by("id")
        .values_list("id", "request_digest")[:1]
    ),
    -7_300_004,
    "probe-idempotency-key-7300004",
)


def _earlier(user: AbstractBaseUser, idempotency: _Idempotency) -> Job | None:
    rows = _EARLIER.rows(user.pk, idempotency.key)
    if not rows:
        return None
    job_id, digest = rows[0]
    if digest != idempotency.digest:
        raise Conflict("This Idempotency-Key was used with a different request.")
    return Job.objects.get(pk=job_id)


def job_submit(
    *, user: AbstractBaseUser, request: JobRequest, idempotency_key: str = "", body: dict | None = None
) -> tuple[Job, bool]:
    """A QUEUED job with GPUs × walltime reserved on the tenant's grant; admission on its
    partition follows in the admit task (jobs_admit_later), which gives it its GPUs (dispatch
    follows) or a reason to wait, quota_wait or capacity_wait. Returns (job,
    created): a repeated Idempotency-Key returns the first job, given the same request body
    (the body as the client sent it: its fingerprint is what a repeat must match)."""
    idempotency = _idempotency(idempotency_key, body)
    if idempotency and (earlier := _earlier(user, idempotency)):
        return earlier, False
    try:
        job = _job_insert(user=user, request=request, idempotency=idempotency)
    except IntegrityError:
        # The same key from the same user at the same instant: the other request won, and this
        # one's transaction (its reservation included) rolled back whole.
        earlier = _earlier(user, idempotency) if idempotency else None
        if earlier is None:
            raise
        return earlier, False
    jobs_admit_later(partition_id=job.partition_id)
    return job, True


@transaction.atomic
def _job_insert(*, user: AbstractBaseUser, request: JobRequest, idempotency: _Idempotency | None) -> Job:
    """The job, its reservation (the grant's row lock), event and audit, in one transaction that
    takes no partition lock: submissions to one partition do not wait for each other."""
    checked = _checked(request)
    partition, script, fraction = checked.partition, checked.script, checked.fraction
    cluster_user = _cluster_user(request, partition.cluster, user)
    hours = _gpu_hours(request, fraction)
    grant = _reserve(request, hours)
    # A hard budget refuses the job (409 budget_exhausted); any budget is looked at after commit.
    if budget_check(tenant=request.tenant, grant=grant, gpu_model_id=request.gpu_model.pk,
                    share=request.share.kind, gpu_hours=hours):  # fmt: skip
        budgets_notify_later(tenant_id=request.tenant.pk)
    cpus, mem = _cpus(request, partition, fraction), _mem(request, partition, fraction)
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
        share=request.share.kind,
        mig_profile=request.share.mig_profile,
        gpu_memory_mib=request.share.memory_mib,
        gpu_cores_pct=request.share.cores_pct,
        device_fraction=fraction,
        walltime_minutes=request.walltime_minutes,
        priority=_priority(request),
        tier=request.tenant.tier,
        cpus_per_gpu=cpus,
        mem_per_gpu_mb=mem,
        env={**request.scenario.env, **request.env},
        script=script,
        template=request.template,
        parameters=request.parameters,
        reserved_gpu_hours=hours,
        preemptible=request.preemptible,
        max_restarts=_max_restarts(request),
        restart_exit_codes=",".join(str(code) for code in sorted(set(request.restart_exit_codes))),
        idempotency_key=idempotency.key if idempotency else "",
        request_digest=idempotency.digest if idempotency else "",
    )
    JobEvent.objects.create(job=job, from_state="", to_state=JobState.QUEUED, reason="submitted")
    audit_record(
        actor=user,
        action="job.submit",
        target=job,
        tenant=request.tenant,
        data={
            "gpus": job.gpus,
            "gpu_model": request.gpu_model.slug,
            "share": request.share.label,
            "gpu_hours_reserved": str(hours),
            "preemptible": job.preemptible,
            "max_restarts": job.max_restarts,
        },
    )
    return job


def _max_restarts(request: JobRequest) -> int:
    if request.max_restarts is not None:
        return request.max_restarts
    return settings.JOB_PREEMPTIBLE_RESTARTS if request.preemptible else 0
