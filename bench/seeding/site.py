"""The seeded site: who belongs where, the grants, the jobs, planned from one random generator
(so that a seed is the same run after run) and then written with COPY (db.py)."""

import json
import math
import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from operator import itemgetter

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission
from django.db.models import Model
from django.utils import timezone

from bench.seeding import timelines
from bench.seeding.db import SeedError, copy_dicts, copy_rows, reserve_ids
from clusters.models import Cluster, ClusterKind, JobIdentity, Partition, Scenario, ScenarioGpu
from jobs.models import Job, JobEvent, JobState, Priority, default_priority, new_token
from portal.core.models import ApiToken, AuditEvent, token_digest
from tenants.models import (
    Membership,
    QuotaGrant,
    QuotaRequest,
    RequestState,
    Role,
    Tenant,
    TenantUserPermission,
    Tier,
)
from tenants.roles import ALL_PERMISSIONS, ROLE_PERMISSIONS, SUBMIT_JOB
from tenants.selectors import quota_deciders

SEED_TENANT_RE = r"^seed-[0-9]{4,}$"
SEED_USER_RE = r"^seed-u[0-9]{5,}$"
TOKEN_NAME = "seed-load"  # noqa: S105  (the tokens' label, not a secret)
TIERS = {Tier.LOW: 15, Tier.NORMAL: 60, Tier.HIGH: 20, Tier.CRITICAL: 5}
JOINING_ROLES = {Role.MEMBER: 65, Role.VIEWER: 25, Role.MANAGER: 10}
SECOND_ROLES = {Role.MEMBER: 50, Role.VIEWER: 40, Role.MANAGER: 10}
SECOND_TENANT_SHARE = 0.1
EXTRA_GRANT_SHARE = 0.3
PARTIAL_APPROVAL_SHARE = 0.15
PENDING_REQUEST_SHARE = 0.1
REJECTED_REQUEST_SHARE = 0.05
LOW_PRIORITY_SHARE = 0.1
# The bench grant: far more than a load can use, so that its submissions are always admitted.
BENCH_GRANT_GPUS = 1024
BENCH_GRANT_HOURS = Decimal(1_000_000)

# The tables a seed writes to, besides the user model's.
SEEDED_MODELS = [
    Tenant, Membership, TenantUserPermission, QuotaGrant, QuotaRequest, Job, JobEvent, AuditEvent, ApiToken,
]  # fmt: skip
EVENT_FIELDS = ["job", "at", "from_state", "to_state", "reason", "raw_state"]
AUDIT_FIELDS = [
    "at", "actor", "actor_username", "tenant_id", "tenant_slug", "action", "target_type", "target_id", "data"
]  # fmt: skip


@dataclass(frozen=True)
class SeedScale:
    tenants: int
    users: int
    finished: int
    active: int
    tokens: int


@dataclass
class SeededGrant:
    id: int
    scenario: Scenario
    partitions: list[Partition]  # of the grant's GPU model: where its ended jobs ran
    active_partitions: list[Partition]  # where its active jobs run: not the bench's partition
    for_bench: bool
    starts_on: date
    ends_on: date
    requested_at: datetime
    decided_at: datetime
    partial: bool  # approved with less than was asked
    used: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    gpus_in_use: int = 0

    @property
    def gpu_model(self):
        return self.partitions[0].gpu_model

    def limits(self) -> tuple[int, Decimal]:
        """(GPUs, GPU-hours) granted: room for the load, or a realistic margin over the use."""
        taken = (self.used + self.reserved).to_integral_value(ROUND_CEILING)
        if self.for_bench:
            gpus, hours = self.gpus_in_use + BENCH_GRANT_GPUS, taken + BENCH_GRANT_HOURS
        else:
            gpus, hours = self.gpus_in_use + max(8, self.gpus_in_use // 2), taken * Decimal("1.25") + 200
        return gpus, hours.quantize(Decimal("0.01"), ROUND_CEILING)


@dataclass
class SeededTenant:
    id: int
    slug: str
    tier: str
    weight: float  # activity, log-normal: a few teams are far busier than most
    created: datetime | None = None
    members: list[tuple[int, str]] = field(default_factory=list)  # (user index, role), owner first
    grants: list[SeededGrant] = field(default_factory=list)  # the bench grant first

    @property
    def submitters(self) -> list[int]:
        return [user for user, role in self.members if SUBMIT_JOB in ROLE_PERMISSIONS[role]]


@dataclass(slots=True)
class PlannedJob:
    tenant: SeededTenant
    grant: SeededGrant
    partition: Partition
    gpus: int
    nodes: int
    walltime_minutes: int
    submitter: int
    priority: str
    timeline: timelines.Timeline | None = None


@dataclass
class SeedResult:
    tenants: list[SeededTenant]
    usernames: list[str]
    tokens: list[tuple[int, str]]  # (user index, key): the keys exist only here and in --out
    counts: dict[str, int]
    bench_oversubscribed: bool  # the bench partition also carries the seeded active jobs


def _pick(rng: random.Random, table: dict):
    return rng.choices(list(table), weights=list(table.values()))[0]


class SiteSeeder:
    def __init__(self, *, cluster: Cluster, bench_partition: Partition, scale: SeedScale, rng_seed: int):
        self.cluster, self.bench, self.scale = cluster, bench_partition, scale
        self.rng = random.Random(rng_seed)  # noqa: S311  (seeded: the same site run after run; no secret)
        self.now, self.today = timezone.now(), timezone.localdate()
        self.partitions = list(cluster.partitions.select_related("gpu_model").order_by("name"))
        self.gpu_models = {p.gpu_model_id: p.gpu_model for p in self.partitions}
        self.scenarios = {s.pk: s for s in Scenario.objects.all()}
        # The (scenario, GPU model) pairs a quota request may name: the scenario lists the model.
        self.pairs = sorted(
            ScenarioGpu.objects.filter(gpu_model_id__in=self.gpu_models).values_list(
                "scenario_id", "gpu_model_id"
            )
        )
        staff = quota_deciders().exclude(username__regex=SEED_USER_RE)
        admin = staff.order_by("id").first()  # decides the seeded requests, as one would on a real site
        self.admin = (admin.pk, admin.get_username()) if admin else None
        self.audit: list[tuple] = []
        self.counts: dict[str, int] = {}
        self.tokens: list[tuple[int, str]] = []

    def plan(self) -> None:
        timelines.check_paths()
        self._plan_people()
        self._plan_quota()
        self._plan_jobs()
        eligible = sorted({user for tenant in self.tenants for user in tenant.submitters})
        if self.scale.tokens > len(eligible):
            raise SeedError(
                f"--tokens {self.scale.tokens}: only {len(eligible)} seeded users may submit jobs."
            )
        self.token_users = sorted(self.rng.sample(eligible, self.scale.tokens))

    def write(self) -> None:
        self._write_people()
        self._write_jobs()
        self._write_quota()  # after the jobs: the grants' ledgers are their sums
        self._write_tokens()
        self.audit.sort(key=itemgetter(0))  # audit ids in time order, as on a real site
        self.counts["audit"] = copy_rows(AuditEvent, AUDIT_FIELDS, self.audit)

    def result(self) -> SeedResult:
        return SeedResult(
            tenants=self.tenants,
            usernames=self.usernames,
            tokens=self.tokens,
            counts=self.counts,
            bench_oversubscribed=self.bench_oversubscribed,
        )

    def _audit(self, at, actor, action: str, target: type[Model], target_id: int, tenant=None, data=None):
        actor_id, actor_name = actor or (None, "")
        tenant_id, tenant_slug = (tenant.id, tenant.slug) if tenant else (None, "")
        target_type, data_json = target._meta.label_lower, json.dumps(data or {})
        row = (
            at,
            actor_id,
            actor_name,
            tenant_id,
            tenant_slug,
            action,
            target_type,
            str(target_id),
            data_json,
        )
        self.audit.append(row)

    def _user(self, index: int) -> tuple[int, str]:
        return self.user_ids[index], self.usernames[index]

    def _days(self, low: float, high: float) -> timedelta:
        return timedelta(seconds=self.rng.uniform(low, high) * 86400)

    # --- Planning

    def _plan_people(self) -> None:
        """An owner for each tenant; the other users join tenants by their activity, the second
        to join a tenant as its manager; a tenth of the users also in a second tenant."""
        rng, scale = self.rng, self.scale
        width = max(4, len(str(scale.tenants)))
        self.tenants = [
            SeededTenant(
                id=pk, slug=f"seed-{i:0{width}d}", tier=_pick(rng, TIERS), weight=rng.lognormvariate(0, 1)
            )
            for i, pk in enumerate(reserve_ids(Tenant, scale.tenants), start=1)
        ]
        width = max(5, len(str(scale.users)))
        self.usernames = [f"seed-u{i:0{width}d}" for i in range(1, scale.users + 1)]
        self.user_ids = reserve_ids(get_user_model(), scale.users)
        home = {}
        for user, tenant in enumerate(self.tenants):
            tenant.members.append((user, Role.OWNER))
            home[user] = tenant
        sizes = [tenant.weight**0.5 for tenant in self.tenants]
        for user, tenant in enumerate(
            rng.choices(self.tenants, sizes, k=scale.users - scale.tenants), scale.tenants
        ):
            tenant.members.append(
                (user, Role.MANAGER if len(tenant.members) == 1 else _pick(rng, JOINING_ROLES))
            )
            home[user] = tenant
        for user in range(scale.users):
            if rng.random() < SECOND_TENANT_SHARE and (other := rng.choice(self.tenants)) is not home[user]:
                other.members.append((user, _pick(rng, SECOND_ROLES)))

    def _plan_quota(self) -> None:
        """Each tenant: a grant with ample room on the bench partition's GPU model (the load
        submits there), a grant on another partition's model (where the active jobs run, so that
        the bench partition's GPUs stay free for the load), at times a third; each approved on a
        request 100 to 130 days ago."""
        rng, bench = self.rng, self.bench
        others = [p for p in self.partitions if p.pk != bench.pk]
        self.bench_oversubscribed = not others
        by_model: dict[int, list[Partition]] = {}
        for partition in self.partitions:
            by_model.setdefault(partition.gpu_model_id, []).append(partition)
        bench_pairs = [pair for pair in self.pairs if pair[1] == bench.gpu_model_id]
        if not bench_pairs:
            raise SeedError(
                f"No scenario lists {bench.gpu_model.slug}, the GPU model of partition {bench.name}."
            )
        other_models = {p.gpu_model_id for p in others}
        other_pairs = [pair for pair in self.pairs if pair[1] in other_models]
        chosen_by_tenant = []
        for _tenant in self.tenants:
            chosen = [rng.choice(bench_pairs)]
            for pool, share in ((other_pairs, 1.0), (self.pairs, EXTRA_GRANT_SHARE)):
                pool = [pair for pair in pool if pair not in chosen]
                if pool and rng.random() < share:
                    chosen.append(rng.choice(pool))
            chosen_by_tenant.append(chosen)
        grant_ids = iter(reserve_ids(QuotaGrant, sum(map(len, chosen_by_tenant))))
        for tenant, chosen in zip(self.tenants, chosen_by_tenant, strict=True):
            for n, (scenario_id, model_id) in enumerate(chosen):
                partitions = by_model[model_id]
                # On a one-partition cluster the active jobs can only share the bench partition.
                active = [p for p in partitions if p.pk != bench.pk] if others else partitions
                starts_on = self.today - timedelta(days=rng.randint(100, 130))
                requested_at = self.now - timedelta(days=(self.today - starts_on).days) - self._days(1, 7)
                tenant.grants.append(
                    SeededGrant(
                        id=next(grant_ids),
                        scenario=self.scenarios[scenario_id],
                        partitions=partitions,
                        active_partitions=active,
                        for_bench=n == 0,
                        starts_on=starts_on,
                        ends_on=self.today + timedelta(days=rng.randint(60, 365)),
                        requested_at=requested_at,
                        decided_at=requested_at + self._days(0.05, 2),
                        partial=rng.random() < PARTIAL_APPROVAL_SHARE,
                    )
                )
            tenant.created = min(g.requested_at for g in tenant.grants) - self._days(5, 200)

    def _plan_jobs(self) -> None:
        rng, scale = self.rng, self.scale
        shapes = {p.pk: timelines.job_shapes(p.gpus_per_node, p.nodes) for p in self.partitions}
        walltimes = {}
        for p in self.partitions:
            cap = min(p.max_walltime_minutes, settings.JOB_MAX_WALLTIME_MINUTES)
            walltimes[p.pk] = [w for w in timelines.WALLTIMES_MIN if w <= cap] or [cap]
        submitters = {t.id: t.submitters for t in self.tenants}

        def planned(tenant: SeededTenant, grant: SeededGrant, partition: Partition) -> PlannedJob:
            gpus, nodes, _weight = rng.choices(shapes[partition.pk], [s[2] for s in shapes[partition.pk]])[0]
            low = rng.random() < LOW_PRIORITY_SHARE
            return PlannedJob(
                tenant=tenant,
                grant=grant,
                partition=partition,
                gpus=gpus,
                nodes=nodes,
                walltime_minutes=rng.choice(walltimes[partition.pk]),
                submitter=rng.choice(submitters[tenant.id]),
                priority=Priority.LOW if low else default_priority(tenant.tier),
            )

        self.jobs: list[PlannedJob] = []
        kinds = timelines.FINISHED_KINDS
        for tenant, kind in zip(
            rng.choices(self.tenants, [t.weight for t in self.tenants], k=scale.finished),
            rng.choices(list(kinds), [weight for weight, *_rest in kinds.values()], k=scale.finished),
            strict=True,
        ):
            grant = rng.choice(tenant.grants)
            job = planned(tenant, grant, rng.choice(grant.partitions))
            job.timeline = timelines.finished_timeline(
                kind,
                walltime_minutes=job.walltime_minutes,
                now=self.now,
                rng=rng,
                canceller=self.usernames[job.submitter],
            )
            self.jobs.append(job)
        hosts = [t for t in self.tenants if any(g.active_partitions for g in t.grants)]
        if scale.active and not hosts:
            raise SeedError(
                f"No partition of {self.cluster.slug} but the bench partition ({self.bench.name}) offers a "
                "GPU model a scenario lists: nowhere for active jobs. Pass --active 0 or another "
                "--bench-partition."
            )
        kinds = timelines.ACTIVE_KINDS
        for tenant, kind in zip(
            rng.choices(hosts, [t.weight for t in hosts], k=scale.active) if scale.active else [],
            rng.choices(list(kinds), [weight for weight, _path in kinds.values()], k=scale.active),
            strict=True,
        ):
            grant = rng.choice([g for g in tenant.grants if g.active_partitions])
            job = planned(tenant, grant, rng.choice(grant.active_partitions))
            job.timeline = timelines.active_timeline(
                kind, walltime_minutes=job.walltime_minutes, now=self.now, rng=rng
            )
            self.jobs.append(job)
        self.jobs.sort(key=lambda job: job.timeline.created)  # ids in submission order, as on a real site

    # --- Writing

    def _write_people(self) -> None:
        User = get_user_model()
        perms = Permission.objects.filter(content_type__app_label="tenants", codename__in=ALL_PERMISSIONS)
        perm_ids = dict(perms.values_list("codename", "id"))
        if len(perm_ids) != len(ALL_PERMISSIONS):
            raise SeedError(
                f"Tenant permissions missing: {sorted(ALL_PERMISSIONS - perm_ids.keys())}; migrate first."
            )
        memberships = [(tenant, user, role) for tenant in self.tenants for user, role in tenant.members]
        joined, rows, perm_rows = {}, [], []
        for pk, (tenant, user, role) in zip(
            reserve_ids(Membership, len(memberships)), memberships, strict=True
        ):
            at = tenant.created if role == Role.OWNER else tenant.created + self._days(0, 10)
            joined[user] = min(at, joined.get(user, at))
            rows.append((pk, self.user_ids[user], tenant.id, role, at, False))  # made by hand, not a mapping
            perm_rows.extend(
                (self.user_ids[user], perm_ids[code], tenant.id) for code in ROLE_PERMISSIONS[role]
            )
            actor = self.admin if role == Role.OWNER else self._user(tenant.members[0][0])
            data = {"username": self.usernames[user], "role": role}
            self._audit(at, actor, "membership.add", Membership, pk, tenant, data)
        # One hash for all, and an unusable one: the load signs in with tokens, nobody with a
        # password, and hashing 5,000 passwords would take longer than the rest of the seed.
        password = make_password(None)
        self.counts["users"] = copy_dicts(
            User,
            (
                {
                    "id": pk, "password": password, "last_login": None, "is_superuser": False,
                    "username": name, "first_name": "", "last_name": "", "email": f"{name}@example.org",
                    "is_staff": False, "is_active": True,
                    "date_joined": joined[i] - timedelta(hours=self.rng.uniform(1, 48)),
                }
                for i, (pk, name) in enumerate(zip(self.user_ids, self.usernames, strict=True))
            ),
        )  # fmt: skip
        self.counts["tenants"] = copy_dicts(
            Tenant,
            (
                {
                    "id": t.id, "slug": t.slug, "name": f"Seeded team {t.slug.removeprefix('seed-')}",
                    "tier": t.tier, "state": "active", "contact_email": f"{t.slug}@example.org",
                    "created": t.created,
                }
                for t in self.tenants
            ),
        )  # fmt: skip
        for tenant in self.tenants:
            self._audit(
                tenant.created, self.admin, "tenant.create", Tenant, tenant.id, tenant, {"tier": tenant.tier}
            )
        self.counts["memberships"] = copy_rows(
            Membership, ["id", "user", "tenant", "role", "joined", "managed"], rows
        )
        self.counts["permissions"] = copy_rows(
            TenantUserPermission, ["user", "permission", "content_object"], perm_rows
        )

    def _write_jobs(self) -> None:
        job_ids = reserve_ids(Job, len(self.jobs))
        env = {pk: json.dumps(scenario.env) for pk, scenario in self.scenarios.items()}
        events: list[tuple] = []

        # each tenant's jobs run as its cluster account: the cluster's template (tenant mode)
        identities = {
            tenant.id: self.cluster.tenant_identity_template.format(tenant=tenant.slug)
            for tenant in self.tenants
            if self.cluster.kind == ClusterKind.SLURM and self.cluster.job_identity == JobIdentity.TENANT
        }

        def rows() -> Iterator[dict]:
            backend_id = timelines.FAKE_BACKEND_ID_BASE
            for job_id, job in zip(job_ids, self.jobs, strict=True):
                tl, grant, partition, scenario = job.timeline, job.grant, job.partition, job.grant.scenario
                reserved = timelines.reserved_hours(job.gpus, job.walltime_minutes)
                active = tl.finished_at is None
                used = None if active else timelines.used_hours(job.gpus, tl.started_at, tl.finished_at)
                if active:  # admitted and not ended: it holds its GPUs and its reservation
                    grant.reserved += reserved
                    grant.gpus_in_use += job.gpus
                else:  # settled as job_finish does: what it ran, never more than it reserved
                    grant.used += min(used, reserved)
                if tl.submitted_at is not None:
                    backend_id += 1
                before = ""
                for state, at, reason, raw in tl.moves:
                    events.append((job_id, at, before, state, reason, raw))
                    before = state
                submitter = self._user(job.submitter)
                data = {
                    "gpus": job.gpus,
                    "gpu_model": grant.gpu_model.slug,
                    "gpu_hours_reserved": str(reserved),
                }
                self._audit(tl.created, submitter, "job.submit", Job, job_id, job.tenant, data)
                if tl.cancelled_from:
                    at = next(at for s, at, *_r in tl.moves if s in (JobState.CANCELLING, JobState.CANCELLED))
                    data = {"state": tl.cancelled_from, "reason": f"cancelled by {submitter[1]}"}
                    self._audit(at, submitter, "job.cancel", Job, job_id, job.tenant, data)
                yield {
                    "id": job_id, "token": new_token(), "tenant": job.tenant.id, "submitted_by": submitter[0],
                    "name": timelines.name_for(scenario.slug, job_id), "scenario": scenario.pk,
                    "gpu_model": partition.gpu_model_id, "grant": grant.id, "cluster": self.cluster.pk,
                    "partition": partition.pk, "gpus": job.gpus, "nodes": job.nodes,
                    "walltime_minutes": job.walltime_minutes, "priority": job.priority,
                    "cpus_per_gpu": min(scenario.cpus_per_gpu, partition.max_cpus_per_gpu or math.inf),
                    "mem_per_gpu_mb": min(scenario.mem_per_gpu_mb, partition.max_mem_per_gpu_mb or math.inf),
                    "env": env[scenario.pk], "script": timelines.script_for(scenario.slug, job_id),
                    "template": "", "parameters": "{}", "state": tl.state, "reason": tl.reason,
                    "raw_state": tl.raw_state, "backend_id": str(backend_id) if tl.submitted_at else "",
                    "cluster_user": identities.get(job.tenant.id, ""),
                    "node_list": timelines.node_list(job.nodes) if tl.started_at else "",
                    "created": tl.created, "submitted_at": tl.submitted_at, "started_at": tl.started_at,
                    "finished_at": tl.finished_at, "exit_code": tl.exit_code, "gpu_hours": used,
                    "reserved_gpu_hours": reserved, "holds_gpus": active,
                    "dispatch_attempts": int(len(tl.moves) > 1 and tl.moves[1][0] == JobState.SUBMITTING),
                    "dispatch_lease_until": None, "idempotency_key": "", "request_digest": "",
                    "gpu_idle_since": None, "gpu_idle_flagged_at": None,
                }  # fmt: skip

        self.counts["jobs"] = copy_dicts(Job, rows())
        self.counts["active_jobs"] = sum(1 for job in self.jobs if job.timeline.finished_at is None)
        events.sort(key=itemgetter(1))  # event ids in time order across jobs, as on a real site
        self.counts["job_events"] = copy_rows(JobEvent, EVENT_FIELDS, events)

    def _write_quota(self) -> None:
        """The grants with their ledgers, each with the request it was approved on, and a few
        requests that were never granted: pending, or rejected."""
        grants, requests = [], []
        pairs = [(tenant, grant) for tenant in self.tenants for grant in tenant.grants]
        for pk, (tenant, grant) in zip(reserve_ids(QuotaRequest, len(pairs)), pairs, strict=True):
            gpus, hours = grant.limits()
            grants.append({
                "id": grant.id, "tenant": tenant.id, "scenario": grant.scenario.pk,
                "gpu_model": grant.gpu_model.pk, "gpus": gpus, "gpu_hours": hours,
                "starts_on": grant.starts_on, "ends_on": grant.ends_on, "gpus_in_use": grant.gpus_in_use,
                "gpu_hours_reserved": grant.reserved, "gpu_hours_used": grant.used,
                "created": grant.decided_at, "reminded_days_before": None,
            })  # fmt: skip
            asked = (gpus * 2, hours * 2) if grant.partial else (gpus, hours)
            state = RequestState.PARTIALLY_APPROVED if grant.partial else RequestState.APPROVED
            note = "Approved in part: the partition is shared." if grant.partial else "Approved."
            owner = self._user(tenant.members[0][0])
            requests.append(self._request(
                pk, tenant, grant.scenario.pk, grant.gpu_model.pk, asked, grant.starts_on, grant.ends_on,
                state, owner, grant.requested_at, grant.decided_at, note, grant.id,
            ))  # fmt: skip
            data = {"note": note, "grant": grant.id, "gpus": gpus, "gpu_hours": str(hours)}
            data["ends_on"] = str(grant.ends_on)
            self._audit(
                grant.decided_at, self.admin, f"quota_request.{state}", QuotaRequest, pk, tenant, data
            )
        rng, share = self.rng, PENDING_REQUEST_SHARE + REJECTED_REQUEST_SHARE
        open_tenants = [tenant for tenant in self.tenants if rng.random() < share]
        for pk, tenant in zip(reserve_ids(QuotaRequest, len(open_tenants)), open_tenants, strict=True):
            rejected = rng.random() < REJECTED_REQUEST_SHARE / share
            created = self.now - (self._days(20, 60) if rejected else self._days(0, 5))
            decided_at = created + self._days(0.1, 3) if rejected else None
            note = "Not this quarter: the partition is fully booked." if rejected else ""
            starts_on = self.today + timedelta(days=7)
            asked = (rng.choice((4, 8, 16)), Decimal(rng.choice((500, 2000, 8000))))
            state = RequestState.REJECTED if rejected else RequestState.PENDING
            requests.append(self._request(
                pk, tenant, *rng.choice(self.pairs), asked, starts_on, starts_on + timedelta(days=90), state,
                self._user(tenant.members[0][0]), created, decided_at, note, None,
            ))  # fmt: skip
            if rejected:
                self._audit(
                    decided_at, self.admin, "quota_request.rejected", QuotaRequest, pk, tenant, {"note": note}
                )
        self.counts["grants"] = copy_dicts(QuotaGrant, iter(grants))
        self.counts["quota_requests"] = copy_dicts(QuotaRequest, iter(requests))

    def _request(
        self,
        pk,
        tenant,
        scenario_id,
        model_id,
        asked,
        starts_on,
        ends_on,
        state,
        owner,
        at,
        decided_at,
        note,
        grant,
    ) -> dict:
        """A quota request row, and the audit of its creation by the tenant's owner."""
        data = {"gpu_model": self.gpu_models[model_id].slug, "gpus": asked[0], "gpu_hours": str(asked[1])}
        self._audit(at, owner, "quota_request.create", QuotaRequest, pk, tenant, data)
        decided = decided_at is not None
        return {
            "id": pk, "tenant": tenant.id, "scenario": scenario_id, "gpu_model": model_id, "gpus": asked[0],
            "gpu_hours": asked[1], "starts_on": starts_on, "ends_on": ends_on,
            "justification": "Runs for the team's projects this term.", "state": state,
            "requested_by": owner[0], "created": at,
            "decided_by": self.admin[0] if decided and self.admin else None, "decided_at": decided_at,
            "decision_note": note, "grant": grant,
        }  # fmt: skip

    def _write_tokens(self) -> None:
        """Real tokens of the users the load acts as: the digest in the table, the key only in
        the result (token_create's rule: the database never holds a usable key)."""
        rows = []
        for pk, user in zip(reserve_ids(ApiToken, len(self.token_users)), self.token_users, strict=True):
            key = secrets.token_urlsafe(32)
            self.tokens.append((user, key))
            rows.append((pk, self.user_ids[user], TOKEN_NAME, token_digest(key), "submit", self.now,
                         self.now + timedelta(days=settings.API_TOKEN_DAYS), None))  # fmt: skip
            self._audit(self.now, self._user(user), "token.create", ApiToken, pk, None, {"name": TOKEN_NAME})
        self.counts["tokens"] = copy_rows(
            ApiToken, ["id", "user", "name", "key_digest", "scope", "created", "expires", "last_used"], rows
        )
