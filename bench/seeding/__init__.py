"""A large, consistent site for load benchmarks (manage.py seed_site documents the --out file).

Consistent means that the portal's own invariants hold, so that the API serves the data as it
serves real data:
- members hold the guardian permissions of their role (tenants.roles), as membership_add gives;
- every job runs on an approved grant of its tenant for its scenario and GPU model, on a
  partition of that GPU model, with the shape, CPUs, memory and priority job_submit would give;
- every grant's ledger is the sum of its jobs: gpu_hours_used of the ended ones (what they
  ran, never more than they reserved), gpu_hours_reserved and gpus_in_use of the active ones;
- every job's events are a path of jobs.states.ALLOWED in time order, ending in its state;
- active jobs are PENDING or RUNNING, admitted (holds_gpus) and with a scheduler id, never
  QUEUED or SUBMITTING, which the worker's sweep would send to the scheduler.

Rows go in with COPY (db.py), in the caller's transaction, with ids from the tables' own
sequences: through the services, 600,000 rows would take an hour, and bulk_create would stamp
every auto_now_add field (Job.created, JobEvent.at, AuditEvent.at) with now, where a real
site's history is spread over months. What is seeded is recognisable by name (SEED_TENANT_RE,
SEED_USER_RE), so that seed_delete removes exactly that, and whatever was added to it since.
"""

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from psycopg import sql

from bench.seeding import db
from bench.seeding.db import SeedError
from bench.seeding.site import (
    SEED_TENANT_RE,
    SEED_USER_RE,
    SEEDED_MODELS,
    TOKEN_NAME,
    SeededGrant,
    SeededTenant,
    SeedResult,
    SeedScale,
    SiteSeeder,
)
from clusters.models import Cluster, Partition
from jobs.models import Job, JobEvent
from portal.core.models import AuditEvent
from tenants.models import Tenant

__all__ = [
    "SEED_TENANT_RE",
    "SEED_USER_RE",
    "TOKEN_NAME",
    "SeedError",
    "SeedResult",
    "SeedScale",
    "SeededGrant",
    "SeededTenant",
    "seed_analyze",
    "seed_delete",
    "seeded_exists",
    "site_seed",
]


def seeded_exists() -> bool:
    return (
        Tenant.objects.filter(slug__regex=SEED_TENANT_RE).exists()
        or get_user_model().objects.filter(username__regex=SEED_USER_RE).exists()
    )


def site_seed(*, cluster: Cluster, bench_partition: Partition, scale: SeedScale, rng_seed: int) -> SeedResult:
    """Seed the site; the caller holds the transaction. Everything is planned before the first
    row is written, so that a scale that cannot be met fails having written nothing."""
    seeder = SiteSeeder(cluster=cluster, bench_partition=bench_partition, scale=scale, rng_seed=rng_seed)
    seeder.plan()
    seeder.write()
    return seeder.result()


def seed_analyze() -> None:
    """Planner statistics for every table a seed writes; run it once the seed is committed."""
    db.analyze([get_user_model(), *SEEDED_MODELS])


def seed_delete() -> dict[str, int]:
    """Delete every seeded tenant and user with all that belongs to them, including what a
    load added since (its jobs, their events, its audit); returns how many of each went. Jobs
    and events go by one statement each: Django's collector would load every job to cascade."""
    User = get_user_model()
    tenant_ids = list(Tenant.objects.filter(slug__regex=SEED_TENANT_RE).values_list("id", flat=True))
    users = User.objects.filter(username__regex=SEED_USER_RE)
    user_ids = list(users.values_list("id", flat=True))
    audit = AuditEvent.objects.filter(Q(tenant_id__in=tenant_ids) | Q(actor_id__in=user_ids))
    counts = {"audit": audit.delete()[0]}
    job, event = Job._meta, JobEvent._meta
    by_tenant = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
        sql.Identifier(job.pk.column),
        sql.Identifier(job.db_table),
        sql.Identifier(job.get_field("tenant").column),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL("DELETE FROM {} WHERE {} IN ({})").format(
                sql.Identifier(event.db_table), sql.Identifier(event.get_field("job").column), by_tenant
            ),
            [tenant_ids],
        )
        counts["job_events"] = cursor.rowcount
        cursor.execute(
            sql.SQL("DELETE FROM {} WHERE {} IN ({})").format(
                sql.Identifier(job.db_table), sql.Identifier(job.pk.column), by_tenant
            ),
            [tenant_ids],
        )
        counts["jobs"] = cursor.rowcount
    counts["tenants"] = Tenant.objects.filter(id__in=tenant_ids).delete()[1].get(Tenant._meta.label, 0)
    counts["users"] = users.delete()[1].get(User._meta.label, 0)
    return counts
