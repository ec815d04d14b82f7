"""The lifecycle cleanup (docs/periodic-tasks.md): one service per beat task, each audited, each
with a dry run that reports what it would do and changes nothing (no state, no backend call that
writes, no AuditEvent), and each reading its limits from settings.

Safe to run twice and at once: a job is cancelled only under its row lock and only while it is
still in the state that made it a candidate; the services that talk to the schedulers hold a
per-cluster run lock in the cache, so that two runs never work on one cluster together.

Bounded: each run handles at most MAX_JOBS_PER_RUN jobs (cancels, pruned timelines), at most
MAX_ORPHANS_PER_CLUSTER orphan cancels per cluster and at most MAX_TENANTS_PER_RUN tenants per
cluster for the scratch purge; a report says `more` when a limit cut the run short, and the next
run goes on. One cluster that cannot be reached (BackendUnavailable) is marked unhealthy, as the
poll does, and skipped; the others are still done.
"""

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from clusters.backends.base import BackendError, BackendUnavailable
from clusters.models import Cluster, ClusterKind, Partition
from clusters.services import backend_of, cluster_config, cluster_mark_health
from jobs.models import Job, JobEvent, JobState
from jobs.services.cancel import job_cancel
from jobs.states import ACTIVE_IN_SCHEDULER, END_STATES
from portal.core.models import AuditEvent
from portal.core.services import audit_record
from tenants.limits import tenant_limits_follow
from tenants.models import QuotaGrant, Tenant, TenantState
from tenants.selectors import tenants_identities

log = logging.getLogger("jobs.cleanup")

MAX_JOBS_PER_RUN = 200
MAX_ORPHANS_PER_CLUSTER = 100
MAX_TENANTS_PER_RUN = 500
# An ended grant gets its "grant.ended" audit and its tenant's limits re-applied once, if it
# ended within this many days; the hourly apply-tenants has lowered older ones long ago.
GRANT_END_LOOKBACK_DAYS = 30
# Lists kept in an AuditEvent's data: the counts are exact, the lists are cut to this length.
AUDIT_LIST_MAX = 20
AUDIT_ERROR_CHARS = 500
# A run lock outlives no run: the longest cleanup task's hard time limit (jobs/tasks.py).
RUN_LOCK_S = 1800
# Tokens the portal gives its jobs (jobs.models.new_token: uuid4().hex).
PORTAL_TOKEN = re.compile(r"^[0-9a-f]{32}$")

WAITING = frozenset({JobState.QUEUED, JobState.SUBMITTING, JobState.PENDING})


def _dry(dry_run: bool | None) -> bool:
    return settings.CLEANUP_DRY_RUN if dry_run is None else dry_run


@dataclass
class CleanupReport:
    """What one run did, or with dry_run would have done. `unreachable`: clusters skipped because
    they could not be reached; `busy`: skipped because another run holds them; `more`: a limit
    cut the run short."""

    dry_run: bool
    more: bool = False
    unreachable: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """Plain JSON-able data: what a task returns and the management command prints."""
        return asdict(self)


@dataclass
class WalltimeCapReport(CleanupReport):
    cap_hours: int = 0
    cancelled: list[int] = field(default_factory=list)


@dataclass
class GrantEndReport(CleanupReport):
    cancelled: list[int] = field(default_factory=list)  # waiting jobs, and running ones if the setting says
    running_left: list[int] = field(default_factory=list)  # running jobs left to finish
    grants_ended: list[int] = field(default_factory=list)  # grants audited (and applied) this run
    tenants_applied: list[int] = field(default_factory=list)


@dataclass
class SuspendedReport(CleanupReport):
    tenants: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # QUEUED jobs that wait in the portal until reactivated
    running_left: list[int] = field(default_factory=list)
    tenants_applied: list[int] = field(default_factory=list)


@dataclass
class OrphanReport(CleanupReport):
    # {cluster, backend_id, account, token, state, known}: known is "" (no such job) or the
    # portal job's end state (the portal ended it, the scheduler still holds it)
    orphans: list[dict] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # "<cluster>:<backend id>"


@dataclass
class ScratchReport(CleanupReport):
    files_deleted: int = 0
    bytes_freed: int = 0
    refused: int = 0
    tenants: list[dict] = field(default_factory=list)  # per cluster and tenant with anything to report


@dataclass
class RetentionReport(CleanupReport):
    scheduler_objects: dict[str, list[str]] = field(default_factory=dict)  # cluster → ids deleted
    jobs_pruned: list[int] = field(default_factory=list)
    events_deleted: int = 0


# --- Shared steps


def _cancel(job_id: int, *, still: Q, reason: str) -> bool:
    """Cancel the job through job_cancel (its audit included) if, under its lock, it still
    matches `still`; False when it has moved on, e.g. another run cancelled it first."""
    with transaction.atomic():
        partition_id = Job.objects.values_list("partition_id", flat=True).get(pk=job_id)
        # Lock order partition → job → grant, as admission and job_finish: cancelling a QUEUED
        # job settles its grant at once.
        Partition.objects.select_for_update(no_key=True).get(pk=partition_id)
        job = Job.objects.select_for_update(of=("self",)).filter(still, pk=job_id).first()
        if job is None:
            return False
        job_cancel(actor=None, job=job, reason=reason)
    return True


def _cancel_each(report, jobs: Q, *, reason: str, dry_run: bool) -> None:
    """Cancel up to MAX_JOBS_PER_RUN jobs matching `jobs`, oldest first, into report.cancelled."""
    ids = list(Job.objects.filter(jobs).order_by("id").values_list("pk", flat=True)[: MAX_JOBS_PER_RUN + 1])
    report.more = report.more or len(ids) > MAX_JOBS_PER_RUN
    for job_id in ids[:MAX_JOBS_PER_RUN]:
        if dry_run or _cancel(job_id, still=jobs, reason=reason):
            report.cancelled.append(job_id)
    if report.cancelled:
        log.info("%s: %s jobs %s", reason, "would cancel" if dry_run else "cancelled", report.cancelled)


@contextlib.contextmanager
def _run_lock(name: str, cluster: Cluster) -> Iterator[bool]:
    """Whether this run may work on the cluster: cache.add is atomic, so of two runs one wins."""
    key, mine = f"cleanup:{name}:{cluster.pk}", uuid.uuid4().hex
    got = cache.add(key, mine, RUN_LOCK_S)
    try:
        yield got
    finally:
        if got and cache.get(key) == mine:
            cache.delete(key)


def _clusters(name: str, report: CleanupReport, cluster_id: int | None = None) -> Iterator[Cluster]:
    """Each enabled cluster (or the one given) this run holds the lock of; the report lists those
    another run holds."""
    clusters = Cluster.objects.filter(enabled=True).order_by("pk")
    if cluster_id is not None:
        clusters = clusters.filter(pk=cluster_id)
    for cluster in clusters:
        with _run_lock(name, cluster) as got:
            if not got:
                report.busy.append(cluster.slug)
                continue
            yield cluster


def _unreachable(report: CleanupReport, cluster: Cluster, exc: BackendUnavailable) -> None:
    if not report.dry_run:  # a dry run writes nothing, health included
        cluster_mark_health(cluster=cluster, healthy=False, detail=str(exc))
    report.unreachable.append(cluster.slug)
    log.warning("cleanup: cluster %s unreachable: %s", cluster.slug, exc)


def _answered(report: CleanupReport, cluster: Cluster) -> None:
    if not cluster.healthy and not report.dry_run:
        cluster_mark_health(cluster=cluster, healthy=True, detail="answers")


NO_ANSWER = object()


def _ask(report: CleanupReport, cluster: Cluster, call, *args, **kwargs):
    """call(*args, **kwargs), a method of the cluster's backend, its health followed as the poll
    does: NO_ANSWER when the cluster cannot be reached (marked unhealthy) or refuses (reported)."""
    try:
        answer = call(*args, **kwargs)
    except BackendUnavailable as exc:
        _unreachable(report, cluster, exc)
        return NO_ANSWER
    except BackendError as exc:
        report.errors.append(f"{cluster.slug}: {exc}")
        return NO_ANSWER
    _answered(report, cluster)
    return answer


def _apply_limits(report, tenant_ids: set[int], dry_run: bool) -> None:
    """Re-apply the tenants' limits on every enabled cluster (tenants.tasks.apply_tenant, on commit)."""
    for tenant_id in sorted(tenant_ids):
        if not dry_run:
            tenant_limits_follow(tenant_id=tenant_id)
        report.tenants_applied.append(tenant_id)


# --- 1. Walltime cap


def jobs_cap_walltime(*, dry_run: bool | None = None) -> WalltimeCapReport:
    """RUNNING → CANCELLING (reason walltime_cap) for jobs that started more than
    JOB_WALLTIME_CAP_HOURS ago, whatever walltime they asked for; the poll confirms CANCELLED."""
    report = WalltimeCapReport(dry_run=_dry(dry_run), cap_hours=settings.JOB_WALLTIME_CAP_HOURS)
    cutoff = timezone.now() - timedelta(hours=settings.JOB_WALLTIME_CAP_HOURS)
    over = Q(state=JobState.RUNNING, started_at__lt=cutoff)
    _cancel_each(report, over, reason="walltime_cap", dry_run=report.dry_run)
    return report


# --- 2. Grants that end


def grants_end(*, dry_run: bool | None = None) -> GrantEndReport:
    """Jobs on grants that ended (ends_on before today): QUEUED → CANCELLED, SUBMITTING and
    PENDING → CANCELLING, all with reason grant_ended; RUNNING jobs finish, or with
    GRANT_END_CANCEL_RUNNING → CANCELLING too. Each newly ended grant gets one "grant.ended"
    audit with a message, and its tenant's scheduler limits are applied again (lowered)."""
    report = GrantEndReport(dry_run=_dry(dry_run))
    today = timezone.localdate()
    states = WAITING | ({JobState.RUNNING} if settings.GRANT_END_CANCEL_RUNNING else set())
    ended = Q(grant__ends_on__lt=today)
    _cancel_each(report, ended & Q(state__in=states), reason="grant_ended", dry_run=report.dry_run)
    running = Job.objects.filter(ended, state=JobState.RUNNING).order_by("id").values_list("pk", flat=True)
    report.running_left = list(running[:MAX_JOBS_PER_RUN])
    tenants = set()
    since = today - timedelta(days=GRANT_END_LOOKBACK_DAYS)
    marked = AuditEvent.objects.filter(action="grant.ended", at__date__gte=since).values_list(
        "target_id", flat=True
    )
    recent = QuotaGrant.objects.filter(ends_on__lt=today, ends_on__gte=since).exclude(
        pk__in=[int(pk) for pk in marked]
    )
    for grant_id in recent.order_by("pk").values_list("pk", flat=True)[:MAX_JOBS_PER_RUN]:
        if _grant_mark_ended(grant_id, report):
            report.grants_ended.append(grant_id)
            tenants.add(QuotaGrant.objects.values_list("tenant_id", flat=True).get(pk=grant_id))
    _apply_limits(report, tenants, report.dry_run)
    return report


def _grant_mark_ended(grant_id: int, report: GrantEndReport) -> bool:
    """The grant's one "grant.ended" audit; False when an earlier run wrote it."""
    with transaction.atomic():
        grant = (
            QuotaGrant.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("tenant", "scenario", "gpu_model")
            .filter(pk=grant_id)
            .first()
        )
        if grant is None:
            return False  # another run holds it and writes the audit
        # Asked after the lock, in a new statement: a run that held the lock before has committed.
        if _audited("grant.ended", grant):
            return False
        if report.dry_run:
            return True
        jobs = Job.objects.filter(grant=grant).order_by("id").values_list("pk", flat=True)
        cancelled = list(jobs.filter(events__reason="grant_ended").distinct()[:AUDIT_LIST_MAX])
        running = list(jobs.filter(state=JobState.RUNNING)[:AUDIT_LIST_MAX])
        fate = "cancelled" if settings.GRANT_END_CANCEL_RUNNING else "left to finish"
        message = (
            f"Grant {grant.pk} of {grant.tenant.slug} for {grant.scenario.slug} on {grant.gpu_model.slug} "
            f"ended on {grant.ends_on}: its waiting jobs are cancelled (reason grant_ended), its running "
            f"jobs {fate}, and the tenant's limits on the clusters lowered."
        )
        audit_record(
            actor=None,
            action="grant.ended",
            target=grant,
            tenant=grant.tenant,
            data={
                "message": message,
                "ends_on": str(grant.ends_on),
                "cancelled": cancelled,
                "running": running,
            },
        )
    return True


def _audited(action: str, target) -> bool:
    return AuditEvent.objects.filter(
        action=action, target_type=target._meta.label_lower, target_id=str(target.pk)
    ).exists()


# --- 3. Suspended tenants


def tenants_hold_suspended(*, dry_run: bool | None = None) -> SuspendedReport:
    """No new work for suspended tenants: their QUEUED jobs stay QUEUED (admission and dispatch
    hold them, reason tenant_suspended) so that a reactivated tenant gets them back; SUBMITTING
    and PENDING jobs → CANCELLING (reason tenant_suspended), since not every scheduler can hold
    them (the local cluster has no account limits); RUNNING jobs finish, or with
    SUSPENDED_CANCEL_RUNNING → CANCELLING too. The limits of tenants with work in a scheduler are
    applied again (zero for a suspended tenant)."""
    report = SuspendedReport(dry_run=_dry(dry_run))
    suspended = Tenant.objects.filter(state=TenantState.SUSPENDED)
    report.tenants = list(suspended.order_by("pk").values_list("pk", flat=True)[:MAX_JOBS_PER_RUN])
    if not report.tenants:
        return report
    states = {JobState.SUBMITTING, JobState.PENDING}
    states |= {JobState.RUNNING} if settings.SUSPENDED_CANCEL_RUNNING else set()
    theirs = Q(tenant__state=TenantState.SUSPENDED)
    _cancel_each(report, theirs & Q(state__in=states), reason="tenant_suspended", dry_run=report.dry_run)
    of_state = Job.objects.filter(theirs).order_by("id").values_list("pk", flat=True)
    report.held = list(of_state.filter(state=JobState.QUEUED)[:MAX_JOBS_PER_RUN])
    report.running_left = list(of_state.filter(state=JobState.RUNNING)[:MAX_JOBS_PER_RUN])
    in_scheduler = Job.objects.filter(theirs, state__in=ACTIVE_IN_SCHEDULER).values_list(
        "tenant_id", flat=True
    )
    _apply_limits(report, set(in_scheduler), report.dry_run)
    return report


# --- 4. Orphans


def orphans_find(*, dry_run: bool | None = None) -> OrphanReport:
    """Scheduler jobs under the tenants' accounts that are no live portal job: a job without a
    portal token (submitted by hand, or by a tenant's job with --account), or one whose token,
    account or user differ from the portal job's (a copied token), or whose portal job has
    ended. Each is reported (log, and one "job.orphan" audit per job and outcome) and, with
    ORPHAN_CANCEL, cancelled in the scheduler (by the operator: no identity of ours owns it).
    Portal jobs the scheduler no longer knows are the poll's: it ends them LOST."""
    report = OrphanReport(dry_run=_dry(dry_run))
    accounts = dict(Tenant.objects.values_list("slug", "pk"))
    if not accounts:
        return report
    for cluster in _clusters("orphans", report):
        backend = backend_of(cluster)
        held = _ask(report, cluster, backend.list_jobs, sorted(accounts))
        if held is NO_ANSWER:
            continue
        tokens = [job.token for job in held if PORTAL_TOKEN.fullmatch(job.token)]
        rows = Job.objects.filter(token__in=tokens).values_list(
            "token", "state", "cluster_id", "backend_id", "tenant__slug", "cluster_user"
        )
        known = {token: rest for token, *rest in rows}
        live = {token: row[0] for token, row in known.items()}
        orphans = [job for job in held if not scheduler_job_is_ours(job, known.get(job.token), cluster)]
        report.more = report.more or len(orphans) > MAX_ORPHANS_PER_CLUSTER
        for job in orphans[:MAX_ORPHANS_PER_CLUSTER]:
            row = {"cluster": cluster.slug, "backend_id": job.backend_id, "account": job.account}
            row |= {"user": job.user}
            row |= {"token": job.token, "state": job.state, "known": live.get(job.token, "")}
            report.orphans.append(row)
            log.warning("orphan on %s: %s", cluster.slug, row)
            if report.dry_run:
                continue
            cancel = settings.ORPHAN_CANCEL
            if cancel:
                try:
                    backend.cancel(job.backend_id)
                except BackendUnavailable as exc:
                    _unreachable(report, cluster, exc)
                    break
                except BackendError as exc:
                    report.errors.append(f"{cluster.slug}:{job.backend_id}: {exc}")
                    cancel = False
                else:
                    report.cancelled.append(f"{cluster.slug}:{job.backend_id}")
            _orphan_audit(cluster, row, cancelled=cancel, tenant_id=accounts.get(job.account))
    return report


def scheduler_job_is_ours(job, row, cluster: Cluster) -> bool:
    """A scheduler job is the portal job whose token it carries only if that job is live, on this
    cluster, under its tenant's account, run by its identity, and (once submitted) has this
    scheduler id: a second job made with a live job's token is an orphan too, whoever made it."""
    if row is None:
        return False
    state, cluster_id, backend_id, account, cluster_user = row
    if state in END_STATES or cluster_id != cluster.pk:
        return False
    # a job submitted before jobs ran as identities records none: it ran as the service user
    ran_as = cluster_user or (cluster.ssh_user if cluster.kind == ClusterKind.SLURM else "")
    if job.account.lower() != account.lower() or job.user != ran_as:
        return False
    return not backend_id or backend_id == job.backend_id


def _orphan_audit(cluster: Cluster, row: dict, *, cancelled: bool, tenant_id: int | None) -> None:
    """One audit per orphan and outcome: reported every run, but written down once."""
    earlier = AuditEvent.objects.filter(
        action="job.orphan", target_type="clusters.cluster", target_id=str(cluster.pk),
        data__backend_id=row["backend_id"], data__token=row["token"], data__cancelled=cancelled,
    )  # fmt: skip
    if earlier.exists():
        return
    tenant = Tenant.objects.filter(pk=tenant_id).first()
    audit_record(
        actor=None, action="job.orphan", target=cluster, tenant=tenant, data=row | {"cancelled": cancelled}
    )


# --- 5. Scratch


def scratch_purge_targets() -> list[tuple[int, int]]:
    """(cluster id, tenant id) of every purge the daily run sends: each enabled cluster that
    keeps scratch (Kubernetes keeps none on the portal's side) with each tenant."""
    clusters = Cluster.objects.filter(enabled=True).exclude(kind=ClusterKind.KUBERNETES)
    tenants = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
    return [
        (cluster_id, tenant_id)
        for cluster_id in clusters.values_list("pk", flat=True)
        for tenant_id in tenants
    ]


def scratch_purge(
    *, dry_run: bool | None = None, cluster_id: int | None = None, tenant_id: int | None = None
) -> ScratchReport:
    """Files older than SCRATCH_PURGE_DAYS under each tenant's scratch directory on each enabled
    cluster (or the one cluster and tenant given: the beat task sends one task per pair, each
    with its own time limit) are deleted by the backend, which refuses any path leading out of
    that directory; one "scratch.purge" audit per cluster and tenant with anything deleted or
    refused. A purge that does not finish (the cluster is down, or a huge tree outlasts the
    command's timeout) is audited as unfinished and leaves the cluster's health to the poll:
    find deletes as it walks, so some files may be gone already."""
    report = ScratchReport(dry_run=_dry(dry_run))
    tenants = Tenant.objects.order_by("pk")
    if tenant_id is not None:
        tenants = tenants.filter(pk=tenant_id)
    tenants = list(tenants[: MAX_TENANTS_PER_RUN + 1])
    report.more = len(tenants) > MAX_TENANTS_PER_RUN
    lock = "scratch" if tenant_id is None else f"scratch:{tenant_id}"
    for cluster in _clusters(lock, report, cluster_id):
        backend = backend_of(cluster)
        identities = tenants_identities(cluster=cluster, tenants=tenants[:MAX_TENANTS_PER_RUN])
        for tenant in tenants[:MAX_TENANTS_PER_RUN]:
            data = {"cluster": cluster.slug, "older_than_days": settings.SCRATCH_PURGE_DAYS}
            try:
                purged = backend.purge_scratch(
                    tenant.slug,
                    older_than_days=settings.SCRATCH_PURGE_DAYS,
                    dry_run=report.dry_run,
                    users=tuple(identities[tenant.pk]),
                )
            except BackendUnavailable as exc:
                report.unreachable.append(cluster.slug)
                report.errors.append(f"{cluster.slug}/{tenant.slug}: {exc}")
                if not report.dry_run:
                    unfinished = data | {"finished": False, "error": str(exc)[:AUDIT_ERROR_CHARS]}
                    audit_record(
                        actor=None, action="scratch.purge", target=tenant, tenant=tenant, data=unfinished
                    )
                break
            except BackendError as exc:
                report.errors.append(f"{cluster.slug}/{tenant.slug}: {exc}")
                continue
            report.files_deleted += len(purged.deleted)
            report.bytes_freed += purged.bytes_freed
            report.refused += len(purged.refused)
            if not purged.deleted and not purged.refused:
                continue
            data |= {
                "finished": True, "files_deleted": len(purged.deleted), "bytes_freed": purged.bytes_freed,
                "deleted": purged.deleted[:AUDIT_LIST_MAX], "refused_count": len(purged.refused),
                "refused": dict(list(purged.refused.items())[:AUDIT_LIST_MAX]), "dry_run": purged.dry_run,
            }  # fmt: skip
            report.tenants.append({"tenant": tenant.slug} | data)
            if not report.dry_run:
                audit_record(actor=None, action="scratch.purge", target=tenant, tenant=tenant, data=data)
    return report


# --- 6. Retention


def retention_apply(*, dry_run: bool | None = None) -> RetentionReport:
    """Two kinds of old records go:

    - in the schedulers, objects of jobs that ended long ago (Kubernetes Jobs past the cluster's
      ttlSecondsAfterFinished; on other clusters, job files past JOB_LOG_RETENTION_DAYS), through
      backend.delete_finished, with one "scheduler.delete_finished" audit per cluster;
    - in the portal, the JobEvents of jobs that ended more than JOB_EVENT_RETENTION_DAYS ago,
      all but each job's first and last event, so that its timeline still shows how it started
      and how it ended (the job row keeps its times, state, reason and GPU-hours); one
      "job_events.prune" audit per tenant."""
    report = RetentionReport(dry_run=_dry(dry_run))
    tenants = list(Tenant.objects.order_by("slug"))
    accounts = [tenant.slug for tenant in tenants]
    for cluster in _clusters("retention", report) if accounts else ():
        if cluster.kind == ClusterKind.KUBERNETES:
            older_than_s = cluster_config(cluster).k8s_job_ttl_s
        else:
            older_than_s = settings.JOB_LOG_RETENTION_DAYS * 86400
        backend = backend_of(cluster)
        identities = tenants_identities(cluster=cluster, tenants=tenants)
        users = {tenant.slug: identities[tenant.pk] for tenant in tenants}
        deleted = _ask(
            report,
            cluster,
            backend.delete_finished,
            accounts,
            older_than_s=older_than_s,
            dry_run=report.dry_run,
            users=users,
        )
        if deleted is NO_ANSWER:
            continue
        report.scheduler_objects[cluster.slug] = deleted
        if deleted and not report.dry_run:
            data = {"older_than_s": older_than_s, "count": len(deleted), "ids": deleted[:AUDIT_LIST_MAX]}
            audit_record(actor=None, action="scheduler.delete_finished", target=cluster, data=data)
    _prune_events(report)
    return report


def _prune_events(report: RetentionReport) -> None:
    cutoff = timezone.now() - timedelta(days=settings.JOB_EVENT_RETENTION_DAYS)
    old = (
        Job.objects.filter(state__in=END_STATES, finished_at__lt=cutoff)
        .annotate(n=Count("events"), first=Min("events__id"), last=Max("events__id"))
        .filter(n__gt=2)
        .order_by("id")
        .values_list("pk", "tenant_id", "n", "first", "last")[: MAX_JOBS_PER_RUN + 1]
    )
    rows = list(old)
    report.more = report.more or len(rows) > MAX_JOBS_PER_RUN
    by_tenant: dict[int, list[tuple[int, int]]] = {}
    for job_id, tenant_id, n, first, last in rows[:MAX_JOBS_PER_RUN]:
        if report.dry_run:
            deleted = n - 2
        else:
            # One job at a time, so that a run cut short leaves whole timelines; a second run
            # at once deletes nothing more (the first and last are never candidates).
            with transaction.atomic():
                middle = JobEvent.objects.filter(job_id=job_id, at__lt=cutoff).exclude(pk__in=(first, last))
                deleted, _ = middle.delete()
        if deleted:
            report.jobs_pruned.append(job_id)
            report.events_deleted += deleted
            by_tenant.setdefault(tenant_id, []).append((job_id, deleted))
    if report.dry_run:
        return
    for tenant in Tenant.objects.filter(pk__in=by_tenant):
        pruned = by_tenant[tenant.pk]
        data = {
            "older_than_days": settings.JOB_EVENT_RETENTION_DAYS, "jobs": len(pruned),
            "events_deleted": sum(n for _, n in pruned), "job_ids": [pk for pk, _ in pruned][:AUDIT_LIST_MAX],
        }  # fmt: skip
        audit_record(actor=None, action="job_events.prune", target=tenant, tenant=tenant, data=data)
