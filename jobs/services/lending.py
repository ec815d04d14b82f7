"""Loans between the tenants of a cohort, and reclaims (docs/architecture/lending.md).

A preemptible job that its own grant cannot hold at once may hold whole GPUs that other members
of its tenant's cohort lend and do not use: admission (admission.py) asks `LendingPool.borrow`.
A loan takes GPUs of the lender's grant's concurrent limit (its gpus_in_use), so that the
lender's own jobs see them in use. When one of those waits for GPUs that its grant has lent
(quota_wait), admission asks `LendingPool.reclaim`: the fewest, youngest borrowed jobs that free
enough give their loans back at once, and are warned and stopped after the cohort's grace
(jobs.services.cancel.job_warn, job_stop); each comes back as its next attempt.

A pass of admission reads a partition's cohorts once (`lending_pool`); the caller holds the
partition's lock and every grant a loan may touch (`LendingPool.grant_ids`), locked with the
others in id order, as admission locks grants."""

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, Sum
from django.utils import timezone

from clusters.models import Partition
from clusters.shares import ShareKind
from jobs.models import Job, JobState, Loan
from jobs.services.common import send_after_commit
from portal.core.services import audit_record
from tenants.models import CohortMember, QuotaGrant, Tenant
from tenants.services import grant_settle, grant_take_gpus

# The jobs a reclaim weighs at once: the youngest this many borrowers of the grant. The search
# for the fewest that free enough tries their combinations, at most 2^12 of them.
RECLAIM_CANDIDATES = 12
# Where a borrowed job is in its life when a reclaim may stop it: admitted and not yet ended.
RECLAIMABLE_STATES = (JobState.QUEUED, JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING)


@dataclass
class LendingPool:
    """What one pass of admission knows of the cohorts on a partition: each member tenant's
    place, the grants members may lend (whole GPUs of the cohort's model, active today), and
    the GPUs lent and borrowed now. Loans made or ended in the pass update it."""

    partition_id: int
    members: dict[int, CohortMember]  # tenant id → its place in the cohort covering this partition
    lender_grants: dict[int, list[int]]  # tenant id → its grants that may lend, by id
    lent: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # lender tenant → GPUs now
    borrowed: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # borrower tenant → GPUs
    lent_by_grant: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    short: set[int] = field(default_factory=set)  # tenants whose own jobs wait for quota: lend nothing new
    waiting_grants: set[int] = field(default_factory=set)  # the waiting jobs' grants, which may reclaim

    def grant_ids(self) -> set[int]:
        """Every grant a loan of this pass may take from or give back to: the members' and the
        waiting jobs' (a reclaim gives back only to the grant that lent)."""
        return {grant_id for ids in self.lender_grants.values() for grant_id in ids} | self.waiting_grants

    def count_loans(self) -> None:
        """The GPUs lent and borrowed now, read once the pass holds grant_ids()' locks: every
        loan changes under its lender grant's lock, so no other pass lends meanwhile past a
        limit. The limits count the loans of the members' cohorts; a grant's lent GPUs (what
        its tenant may reclaim) count every open loan of it, of whatever cohort or partition."""
        self.lent.clear()
        self.borrowed.clear()
        self.lent_by_grant.clear()
        open_loans = Loan.objects.filter(ended_at__isnull=True)
        cohorts = {member.cohort_id for member in self.members.values()}
        for row in (
            open_loans.filter(cohort_id__in=cohorts)
            .values("lender_id", "borrower_id")
            .annotate(gpus=Sum("gpus"))
        ):
            self.lent[row["lender_id"]] += row["gpus"]
            self.borrowed[row["borrower_id"]] += row["gpus"]
        for row in (
            open_loans.filter(lender_grant_id__in=self.grant_ids())
            .values("lender_grant_id")
            .annotate(gpus=Sum("gpus"))
        ):
            self.lent_by_grant[row["lender_grant_id"]] += row["gpus"]

    # --- Borrowing

    def borrow_plan(
        self, job: Job, grant: QuotaGrant, grants: dict[int, QuotaGrant]
    ) -> dict[int, int] | None:
        """Lender grant id → GPUs, which with the room left on the job's own grant hold the job;
        None when the job may not borrow or the cohort cannot lend enough now."""
        member = self.members.get(job.tenant_id)
        if member is None or not job.preemptible or job.share != ShareKind.WHOLE:
            return None
        own = max(0, min(grant.gpus - grant.gpus_in_use, job.gpus))
        need = job.gpus - own
        if need <= 0 or need > member.borrowing_limit - self.borrowed[job.tenant_id]:
            return None
        plan: dict[int, int] = {}
        lenders = [
            other
            for tenant_id, other in self.members.items()
            if other.cohort_id == member.cohort_id
            and tenant_id != job.tenant_id
            and tenant_id not in self.short
        ]
        for lender in sorted(
            lenders, key=lambda m: (-(m.lending_limit - self.lent[m.tenant_id]), m.tenant_id)
        ):
            may_lend = lender.lending_limit - self.lent[lender.tenant_id]
            for grant_id in self.lender_grants.get(lender.tenant_id, ()):
                idle = grants[grant_id].gpus - grants[grant_id].gpus_in_use
                take = min(idle, may_lend, need - sum(plan.values()))
                if take > 0:
                    plan[grant_id] = take
                    may_lend -= take
            if sum(plan.values()) == need:
                return plan
        return None

    def borrow(
        self, job: Job, grant: QuotaGrant, grants: dict[int, QuotaGrant], plan: dict[int, int]
    ) -> bool:
        """Take the job's own room on its grant and the planned GPUs of the lenders' grants, and
        record the loans; False (nothing taken) when a grant refused after all."""
        own = job.gpus - sum(plan.values())
        taken: list[tuple[int, int]] = []
        for grant_id, gpus in [(job.grant_id, own), *sorted(plan.items())]:
            if gpus and not grant_take_gpus(grant_id=grant_id, gpus=gpus):
                for back_id, back in taken:
                    grant_settle(grant_id=back_id, reserved_gpu_hours=0, used_gpu_hours=0, gpus=back)
                return False
            taken.append((grant_id, gpus))
        grant.gpus_in_use += own
        now = timezone.now()
        member = self.members[job.tenant_id]
        loans = []
        for grant_id, gpus in sorted(plan.items()):
            lender = grants[grant_id]
            lender.gpus_in_use += gpus
            loans.append(
                Loan(
                    cohort_id=member.cohort_id, job_id=job.pk, attempt=job.attempt, borrower_id=job.tenant_id,
                    lender_id=lender.tenant_id, lender_grant_id=grant_id, gpus=gpus, started_at=now,
                )
            )  # fmt: skip
            self.lent[lender.tenant_id] += gpus
            self.lent_by_grant[grant_id] += gpus
        Loan.objects.bulk_create(loans)
        self.borrowed[job.tenant_id] += sum(plan.values())
        job.gpus_borrowed = sum(plan.values())
        tenants = Tenant.objects.in_bulk({job.tenant_id} | {loan.lender_id for loan in loans})
        for loan in loans:  # in both tenants' audit logs: the lender's about its grant
            audit_record(
                actor=None, action="loan.start", target=grants[loan.lender_grant_id],
                tenant=tenants[loan.lender_id], data=_loan_data(loan, lender=True),
            )  # fmt: skip
            audit_record(
                actor=None, action="loan.start", target=job, tenant=tenants[job.tenant_id],
                data=_loan_data(loan, lender=False),
            )  # fmt: skip
        return True

    # --- Reclaiming

    def reclaim(self, job: Job, grant: QuotaGrant, grants: dict[int, QuotaGrant]) -> list[int]:
        """The lender's job waits for GPUs its grant has lent: end the loans of the fewest,
        youngest borrowed jobs that free enough on that grant (never a lender's own job), and
        have them warned and stopped after their cohort's grace. Returns the jobs reclaimed
        from; [] when the loans are not what holds it back or cannot free enough."""
        lent = self.lent_by_grant.get(grant.pk, 0)
        need = grant.gpus_in_use + job.gpus - grant.gpus
        if not lent or need <= 0 or need > lent:
            return []
        loans = list(
            Loan.objects.filter(lender_grant_id=grant.pk, ended_at__isnull=True)
            .select_related("cohort")
            .order_by("-started_at", "-id")
        )
        by_job: dict[int, int] = defaultdict(int)
        for loan in loans:
            by_job[loan.job_id] += loan.gpus
        # the borrowed jobs that nobody else is changing now, youngest loans first; their loans
        # read again once they are locked (one may have ended meanwhile)
        free = set(
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=by_job, state__in=RECLAIMABLE_STATES)
            .values_list("pk", flat=True)
        )
        loans = [loan for loan in loans if loan.job_id in free]
        still_open = set(
            Loan.objects.filter(pk__in=[loan.pk for loan in loans], ended_at__isnull=True).values_list(
                "pk", flat=True
            )
        )
        loans = [loan for loan in loans if loan.pk in still_open]
        by_job = defaultdict(int)
        for loan in loans:
            by_job[loan.job_id] += loan.gpus
        candidates = list(dict.fromkeys(loan.job_id for loan in loans))
        chosen = fewest_that_free(candidates[:RECLAIM_CANDIDATES], by_job, need)
        if not chosen:
            return []
        now = timezone.now()
        for borrower_id in chosen:
            self._reclaim_from(borrower_id, grants=grants, lender_job=job, now=now)
        return chosen

    def _reclaim_from(
        self, job_id: int, *, grants: dict[int, QuotaGrant], lender_job: Job, now: datetime
    ) -> None:
        borrowed = Job.objects.select_related("tenant").get(pk=job_id)
        loans = list(
            Loan.objects.filter(job_id=job_id, ended_at__isnull=True).select_related(
                "cohort", "lender", "lender_grant"
            )
        )
        if not loans:
            return  # ended since they were read
        # a loan whose cohort was deleted since: the site's default grace
        grace = max(
            loan.cohort.reclaim_grace_s if loan.cohort_id else settings.JOB_PREEMPT_GRACE_S for loan in loans
        )
        for loan in loans:
            loan.ended_at, loan.reclaimed = now, True
            grant_settle(
                grant_id=loan.lender_grant_id, reserved_gpu_hours=0, used_gpu_hours=0, gpus=loan.gpus
            )
            if loan.lender_grant_id in grants:
                grants[loan.lender_grant_id].gpus_in_use -= loan.gpus
            self.lent[loan.lender_id] -= loan.gpus
            self.lent_by_grant[loan.lender_grant_id] -= loan.gpus
            self.borrowed[loan.borrower_id] -= loan.gpus
            for tenant in (loan.lender, borrowed.tenant):
                lender = tenant is loan.lender
                data = _loan_data(loan, lender=lender) | {"grace_s": grace}
                if lender:
                    data["for_job"] = lender_job.pk  # its own job, which needed the GPUs
                audit_record(
                    actor=None, action="loan.reclaim", target=loan.lender_grant if lender else borrowed,
                    tenant=tenant, data=data,
                )  # fmt: skip
        Loan.objects.bulk_update(loans, ["ended_at", "reclaimed"])
        if borrowed.state == JobState.QUEUED:
            self._unadmit(borrowed, grants=grants)
            return
        stop_at = now + timedelta(seconds=grace)
        reason = f"reclaimed by its lender: stops by {stop_at:%H:%M:%S} UTC"  # the lender not named
        Job.objects.filter(pk=job_id).update(stop_at=stop_at, reason=reason[:200])
        send_after_commit("jobs.tasks.warn_job", job_id=job_id, attempt=borrowed.attempt)

    def _unadmit(self, job: Job, *, grants: dict[int, QuotaGrant]) -> None:
        """A reclaimed job that was admitted but not yet sent to its scheduler: nothing to warn
        or stop. Its own GPUs go back too (its grant is one of the pool's, locked), and it waits
        in line again; dispatch leaves a QUEUED job that holds no GPUs alone."""
        own = job.gpus - job.gpus_borrowed
        if job.holds_gpus and own:
            grant_settle(grant_id=job.grant_id, reserved_gpu_hours=0, used_gpu_hours=0, gpus=own)
            if job.grant_id in grants:
                grants[job.grant_id].gpus_in_use -= own
        Job.objects.filter(pk=job.pk).update(
            holds_gpus=False, gpus_borrowed=0, dispatch_lease_until=None, reason="quota_wait"
        )


def fewest_that_free(candidates: list[int], gpus: dict[int, int], need: int) -> list[int]:
    """The fewest of the candidates (youngest first) whose GPUs add up to `need` or more; of
    as few, the youngest. [] when all of them together free less."""
    for count in range(1, len(candidates) + 1):
        for combination in itertools.combinations(candidates, count):
            if sum(gpus[job_id] for job_id in combination) >= need:
                return list(combination)
    return []


def _loan_data(loan: Loan, *, lender: bool) -> dict:
    """What a loan's audit event says in one side's log, neither naming the other tenant nor
    its objects: the lender's (its target the grant that lent) the GPUs, the borrower's (its
    target the job) the GPUs and the job's attempt."""
    data = {"loan": loan.pk, "gpus": loan.gpus, "cohort": loan.cohort_id}
    if not lender:
        data["attempt"] = loan.attempt
    return data


def lending_pool(partition: Partition, waiting: list[Job]) -> LendingPool | None:
    """The cohorts covering the partition, read once for an admission pass; None where no
    waiting job could borrow (no cohort covers the partition, or none is preemptible) or
    reclaim (its grant lent nothing, in whatever cohort or on whatever partition). The caller
    locks `grant_ids()` and then counts the open loans (`count_loans`) under those locks."""
    members = list(
        CohortMember.objects.filter(cohort__gpu_model_id=partition.gpu_model_id)
        .filter(Q(cohort__partition__isnull=True) | Q(cohort__partition_id=partition.pk))
        .select_related("cohort")
    )
    waiting_grants = {job.grant_id for job in waiting}
    lent_by_waiting = Loan.objects.filter(ended_at__isnull=True, lender_grant_id__in=waiting_grants).exists()
    if not lent_by_waiting and not (members and any(job.preemptible for job in waiting)):
        return None
    pool = LendingPool(
        partition_id=partition.pk,
        members={m.tenant_id: m for m in members},
        lender_grants={},
        waiting_grants=waiting_grants,
    )
    today = timezone.localdate()
    lendable = (
        QuotaGrant.objects.active_on(today)
        .filter(tenant_id__in=pool.members, gpu_model_id=partition.gpu_model_id, share=ShareKind.WHOLE)
        .order_by("id")
        .values_list("tenant_id", "pk")
    )
    for tenant_id, grant_id in lendable:
        pool.lender_grants.setdefault(tenant_id, []).append(grant_id)
    return pool


def loans_end(job_ids: list[int], *, now: datetime) -> dict[int, int]:
    """The open loans of jobs that end (or wait again) closed; lender grant id → GPUs that go
    back to it, which the caller settles with the grants it holds locked."""
    back: dict[int, int] = defaultdict(int)
    loans = list(Loan.objects.filter(job_id__in=job_ids, ended_at__isnull=True))
    for loan in loans:
        loan.ended_at = now
        back[loan.lender_grant_id] += loan.gpus
    if loans:
        Loan.objects.bulk_update(loans, ["ended_at"])
    return back


def open_loan_grants(job_ids) -> set[int]:
    """The lender grants of these jobs' open loans: what their end must lock with their own."""
    return set(
        Loan.objects.filter(job_id__in=job_ids, ended_at__isnull=True).values_list(
            "lender_grant_id", flat=True
        )
    )
