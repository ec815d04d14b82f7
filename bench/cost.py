"""What the money side costs to compute: a job answer's cost, usage, a statement, the site report
and a statement's PDF, on a site of its own (prices changing every few days, jobs over two months).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal_bench_cost .venv/bin/python bench/cost.py \
        [--jobs 20000] [--tenants 20] [--rounds 5]

It migrates that database, fills it (once: a second run reuses what it finds), and prints, for
each figure, the median of --rounds timings in milliseconds, and the queries it took. Nothing
in the test suite asserts a time (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from billing.models import Price, TierMultiplier  # noqa: E402
from clusters.models import Cluster, ClusterKind, GpuModel, Partition, Scenario  # noqa: E402
from jobs.costs import costs_of  # noqa: E402
from jobs.models import Job, JobState  # noqa: E402
from jobs.selectors import JOB_ANSWER, job_answer_rows_visible_to, usage_of  # noqa: E402
from reports.pdf import statement_pdf  # noqa: E402
from reports.site import site_report_of  # noqa: E402
from reports.statements import statement_make  # noqa: E402
from tenants.models import QuotaGrant, Tenant  # noqa: E402

PREFIX = "costbench-"


def fill(*, jobs: int, tenants: int, rng: random.Random) -> None:
    """Tenants with a grant each, an H100 partition, prices changing every 5 days for 90 days,
    and `jobs` ended jobs over the last 60 days (a tenth of them still running)."""
    if Tenant.objects.filter(slug__startswith=PREFIX).exists():
        return
    model, scenario = GpuModel.objects.get(slug="h100-80gb"), Scenario.objects.get(slug="ai-training")
    cluster = Cluster.objects.create(slug=f"{PREFIX}c", name="bench", kind=ClusterKind.LOCAL, local_gpus=512)
    partition = Partition.objects.create(
        cluster=cluster, name="h100", gpu_model=model, gpus_per_node=8, nodes=64, max_walltime_minutes=4320
    )
    now = timezone.now()
    Price.objects.bulk_create(
        Price(
            gpu_model=model,
            per_gpu_hour=Decimal(15) + Decimal(i % 7),
            effective_from=now - timedelta(days=90 - 5 * i),
        )
        for i in range(19)
    )
    TierMultiplier.objects.create(
        tier="high", multiplier=Decimal("1.2"), effective_from=now - timedelta(days=120)
    )
    user = get_user_model().objects.create(username=f"{PREFIX}user")
    grants = []
    for i in range(tenants):
        tenant = Tenant.objects.create(
            slug=f"{PREFIX}{i}", name=f"Bench {i}", tier="high" if i % 3 else "normal"
        )
        grants.append(
            QuotaGrant.objects.create(
                tenant=tenant, scenario=scenario, gpu_model=model, gpus=64, gpu_hours=10**7,
                starts_on=(now - timedelta(days=120)).date(), ends_on=(now + timedelta(days=60)).date(),
            )
        )  # fmt: skip
    rows = []
    for _ in range(jobs):
        grant = rng.choice(grants)
        start = now - timedelta(minutes=rng.randrange(60, 60 * 24 * 60))
        gpus, hours = rng.choice([1, 2, 4, 8]), rng.randrange(1, 48 * 4) / 4
        running = rng.random() < 0.1 and start + timedelta(hours=hours) > now
        rows.append(
            Job(
                tenant_id=grant.tenant_id, submitted_by=user, name="bench", scenario=scenario, gpu_model=model,
                grant=grant, cluster=cluster, partition=partition, gpus=gpus, walltime_minutes=int(hours * 60) + 60,
                cpus_per_gpu=1, mem_per_gpu_mb=100, script="#!/bin/sh\n", tier="high" if grant.tenant_id % 3 else "normal",
                state=JobState.RUNNING if running else JobState.COMPLETED, started_at=start,
                finished_at=None if running else start + timedelta(hours=hours),
                gpu_hours=None if running else Decimal(str(gpus * hours)),
                reserved_gpu_hours=Decimal(str(gpus * (hours + 1))),
            )
        )  # fmt: skip
    Job.objects.bulk_create(rows, batch_size=1000)


def timed(label: str, fn, rounds: int) -> None:
    times, queries = [], 0
    for _ in range(rounds):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
        queries = len(captured)
    print(f"  {label:<58} {statistics.median(times):9.1f} ms  ({queries} queries)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    fill(jobs=args.jobs, tenants=args.tenants, rng=random.Random(7))  # noqa: S311 (a bench's picks)
    tenant = Tenant.objects.filter(slug__startswith=PREFIX).order_by("slug").first()
    staff = get_user_model().objects.filter(
        is_superuser=True
    ).first() or get_user_model().objects.create_superuser(f"{PREFIX}admin", password=None)
    per_tenant = Job.objects.filter(tenant=tenant).count()
    today = timezone.localdate()
    month = (today.replace(day=1) - timedelta(days=1)).replace(day=1)
    print(f"cost bench: {Job.objects.filter(tenant__slug__startswith=PREFIX).count()} jobs, "
          f"{args.tenants} tenants ({per_tenant} jobs of the first), 19 price changes, {args.rounds} rounds")  # fmt: skip

    page = list(job_answer_rows_visible_to(user=staff).filter(tenant=tenant).order_by("-id")[:50])
    assert page and all(column in page[0] for column in JOB_ANSWER.values())
    timed(
        "the costs of a page of 50 job answers (costs_of)",
        lambda: costs_of((r["id"], r) for r in page),
        args.rounds,
    )
    timed(
        "GET /usage/ of one tenant, 30 days by day (usage_of)",
        lambda: usage_of(user=staff, tenant_slug=tenant.slug, start=today - timedelta(days=29), end=today, group_by="day"),
        args.rounds,
    )  # fmt: skip

    class Undone(Exception):
        pass

    # A tenant without the month's statement yet (statements are kept: a second run of the bench
    # takes the next tenant), made inside a transaction rolled back: each round makes it anew.
    fresh = (
        Tenant.objects.filter(slug__startswith=PREFIX)
        .exclude(statements__month=month)
        .order_by("slug")
        .first()
    )

    def make() -> None:
        try:
            with transaction.atomic():
                statement_make(tenant=fresh, month=month)
                raise Undone
        except Undone:
            pass

    if fresh is not None:
        timed(f"a statement of {month:%Y-%m} for one tenant, made", make, args.rounds)
    statement_make(tenant=tenant, month=month)
    statement = tenant.statements.get(month=month)
    print(f"    its lines: {statement.lines.count()}, total {statement.cost:.2f} {statement.currency}")
    for language in ("en", "zh-hans"):
        size = [0]

        def render(language=language, size=size) -> None:
            size[0] = len(statement_pdf(statement, language=language))

        timed(f"its PDF in {language}", render, args.rounds)
        print(f"    {size[0] / 1024:.0f} KiB")
    timed(
        "the site report over 30 days (every tenant)",
        lambda: site_report_of(user=staff, start=today - timedelta(days=29), end=today),
        max(1, args.rounds // 2),
    )


if __name__ == "__main__":
    main()
