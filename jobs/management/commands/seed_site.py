"""`manage.py seed_site`: a large, consistent site on PostgreSQL for load benchmarks (bench/load.py).

    manage.py seed_site [--tenants 500] [--users 5000] [--finished 100000] [--active 2000]
        [--tokens 300] [--cluster testbed] [--bench-partition NAME] [--out var/bench/site.json]
        [--seed 1] [--reset]

Seeds tenants seed-0001…, users seed-u00001… (an owner per tenant, managers, members and
viewers, a tenth of them in two tenants, no usable password), approved grants with their
requests and audit, ended jobs over the last 90 days with their events, and active jobs
(PENDING or RUNNING, with scheduler ids above Slurm's MaxJobId, which no real job has), all in
one transaction (bench/seeding says which invariants hold). The cluster must exist:
`manage.py register_testbed` (or demo_data) makes `testbed`. A second seed is refused;
--reset first deletes what an earlier seed made, and what was added to its tenants since.

The bench partition (--bench-partition; default: the cluster's largest) is where a load's
submissions go: every tenant has a grant with ample room on its GPU model, and the seeded
active jobs run on the other partitions, so that its GPUs stay free for the load. On a cluster
with one partition they share it, and the load's jobs wait for capacity (the command says so).

--out is written with mode 0600, since it holds working API keys (the database holds only their
digests):

    {
      "cluster": "testbed",
      "bench_partition": "a100",
      "partitions": [{"name": "a100", "gpu_model": "a100-80gb", "gpus_per_node": 4, "nodes": 2,
                      "max_walltime_minutes": 1440, "bench": true}, …],
      "users": [{"username": "seed-u00042", "token": "<key>",
                 "tenants": [{"slug": "seed-0007", "role": "member"}, …]}, …],
      "tenants": {"seed-0007": {"slug": "seed-0007", "scenario": "ai-training",
                  "gpu_model": "a100-80gb", "partition": "a100", "grant": "812", "gpus": 1024,
                  "gpu_hours": "1003113.00"}, …},
      "seed": {"tenants": 500, "users": 5000, "finished": 100000, "active": 2000, "tokens": 300,
               "rng_seed": 1, "created": "2026-11-29T21:45:02+00:00", "counts": {…}}
    }

`users` are the --tokens users, each a member, manager or owner of at least one tenant (roles
member and above may submit; a viewer role in their list is for reads). `tenants` has every
tenant of those users: POST /api/v1/jobs/ with its scenario, gpu_model, the cluster and the
partition is never refused for quota on the grant named (a job of up to gpus_per_node × nodes
GPUs and max_walltime_minutes), and takes GPUs at once while the partition has them free.

The seed writes rows only and asks no scheduler. With a worker and beat running on the same
database: the first poll finds none of the seeded active jobs in Slurm and ends them LOST
(their grants settled); and the seeded tenants have no Slurm account until apply-tenants (hourly,
or tenants.limits.tenant_apply) makes them, so that sbatch refuses a load's job (REJECTED).
"""

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from bench import seeding
from clusters.models import Cluster

LIMITS = {
    "tenants": (1, 99_999),
    "users": (1, 999_999),
    "finished": (0, 10_000_000),
    "active": (0, 1_000_000),
}


class Command(BaseCommand):
    help = "Seed a large, consistent site (tenants, users, grants, jobs, tokens) for load benchmarks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenants", type=int, default=500)
        parser.add_argument("--users", type=int, default=5000, help="at least one per tenant (its owner)")
        parser.add_argument("--finished", type=int, default=100_000, help="ended jobs over the last 90 days")
        parser.add_argument("--active", type=int, default=2000, help="PENDING and RUNNING jobs")
        parser.add_argument("--tokens", type=int, default=300, help="users who get an API token in --out")
        parser.add_argument("--cluster", default="testbed", help="slug of an existing cluster")
        parser.add_argument("--bench-partition", default="", help="where the load submits (default: largest)")
        parser.add_argument("--out", default=str(settings.BASE_DIR / "var" / "bench" / "site.json"))
        parser.add_argument("--seed", type=int, default=1, help="random seed: the same seed, the same site")
        parser.add_argument("--reset", action="store_true", help="delete an earlier seed first")

    def handle(self, *args, cluster: str, bench_partition: str, out: str, seed: int, reset: bool, **options):
        scale = self._scale(options)
        if connection.vendor != "postgresql":
            raise CommandError(
                f"seed_site writes with PostgreSQL's COPY; this database is {connection.vendor}."
            )
        cluster_obj = Cluster.objects.filter(slug=cluster).first()
        if cluster_obj is None:
            raise CommandError(
                f"No cluster {cluster!r}: run `manage.py register_testbed` (or demo_data) first, "
                "or name another with --cluster."
            )
        bench = self._bench_partition(cluster_obj, bench_partition)
        out_path = Path(out).resolve()
        started = time.monotonic()
        tmp, tmp_path = self._open_out(out_path)  # before the seed: a bad --out fails at once
        try:
            with transaction.atomic():
                # Two seeds at once would both find no seed and both write: the second waits here.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(hashtext('jobs.seed_site'))")
                if seeding.seeded_exists():
                    if not reset:
                        raise CommandError(
                            "This database already holds a seeded site (tenants seed-…, users seed-u…): "
                            "pass --reset to delete it and seed again."
                        )
                    deleted = seeding.seed_delete()
                    self.stdout.write(
                        f"reset: deleted {_counts(deleted)} ({time.monotonic() - started:.1f} s)"
                    )
                result = seeding.site_seed(
                    cluster=cluster_obj, bench_partition=bench, scale=scale, rng_seed=seed
                )
                doc = _site_document(cluster_obj, bench, result, scale, rng_seed=seed)
                tmp.write(json.dumps(doc, indent=1))
                tmp.close()
        except seeding.SeedError as exc:
            _discard(tmp, tmp_path)
            raise CommandError(str(exc)) from None
        except BaseException:
            _discard(tmp, tmp_path)
            raise
        os.replace(tmp_path, out_path)  # only once committed: then the keys in it work
        seeding.seed_analyze()
        self.stdout.write(f"seeded {_counts(result.counts)} in {time.monotonic() - started:.1f} s")
        self.stdout.write(f"{len(result.tokens)} tokens and the bench targets in {out_path} (mode 0600)")
        if result.bench_oversubscribed:
            self.stdout.write(
                self.style.WARNING(
                    f"{cluster} has one partition: the seeded active jobs hold its GPUs, and jobs a load "
                    "submits wait for capacity (reason capacity_wait)."
                )
            )

    def _scale(self, options: dict) -> seeding.SeedScale:
        errors = [
            f"--{name} must be from {low:,} to {high:,}, not {options[name]:,}."
            for name, (low, high) in LIMITS.items()
            if not low <= options[name] <= high
        ]
        if not errors and options["users"] < options["tenants"]:
            errors.append(
                f"--users ({options['users']:,}) must be at least --tenants ({options['tenants']:,})."
            )
        if not 0 <= options["tokens"] <= options["users"]:
            errors.append(
                f"--tokens must be from 0 to --users ({options['users']:,}), not {options['tokens']:,}."
            )
        if errors:
            raise CommandError(" ".join(errors))
        return seeding.SeedScale(
            **{name: options[name] for name in ("tenants", "users", "finished", "active", "tokens")}
        )

    def _bench_partition(self, cluster: Cluster, name: str):
        partitions = list(cluster.partitions.select_related("gpu_model").order_by("name"))
        if not partitions:
            raise CommandError(f"Cluster {cluster.slug} has no partition.")
        if not name:
            return min(partitions, key=lambda p: (-p.gpus_total, p.name))
        for partition in partitions:
            if partition.name == name:
                return partition
        names = ", ".join(p.name for p in partitions)
        raise CommandError(f"Cluster {cluster.slug} has no partition {name!r}; it has {names}.")

    def _open_out(self, path: Path) -> tuple[TextIO, Path]:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # mkstemp makes the file 0600 from the start: the keys are never readable by others.
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        except OSError as exc:
            raise CommandError(f"Cannot write --out {path}: {exc.strerror}.") from None
        return os.fdopen(fd, "w", encoding="utf-8"), Path(name)


def _discard(tmp: TextIO, path: Path) -> None:
    tmp.close()
    path.unlink(missing_ok=True)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {name.replace('_', ' ')}" for name, n in counts.items())


def _site_document(cluster: Cluster, bench, result: seeding.SeedResult, scale, *, rng_seed: int) -> dict:
    keys = dict(result.tokens)
    users = []
    for tenant in result.tenants:
        for user, role in tenant.members:
            if user in keys:
                users.append((user, tenant.slug, role))
    memberships: dict[int, list[dict]] = {}
    for user, slug, role in sorted(users):
        memberships.setdefault(user, []).append({"slug": slug, "role": role})
    slugs = {slug for _user, slug, _role in users}
    tenants = {}
    for tenant in result.tenants:
        if tenant.slug in slugs:
            grant = tenant.grants[0]  # the bench grant
            gpus, hours = grant.limits()
            tenants[tenant.slug] = {
                "slug": tenant.slug,
                "scenario": grant.scenario.slug,
                "gpu_model": grant.gpu_model.slug,
                "partition": bench.name,
                "grant": str(grant.id),
                "gpus": gpus,
                "gpu_hours": str(hours),
            }
    return {
        "cluster": cluster.slug,
        "bench_partition": bench.name,
        "partitions": [
            {
                "name": p.name,
                "gpu_model": p.gpu_model.slug,
                "gpus_per_node": p.gpus_per_node,
                "nodes": p.nodes,
                "max_walltime_minutes": p.max_walltime_minutes,
                "bench": p.pk == bench.pk,
            }
            for p in cluster.partitions.select_related("gpu_model").order_by("name")
        ],
        "users": [
            {"username": result.usernames[user], "token": keys[user], "tenants": memberships[user]}
            for user in sorted(keys)
        ],
        "tenants": tenants,
        "seed": {
            **{name: getattr(scale, name) for name in ("tenants", "users", "finished", "active", "tokens")},
            "rng_seed": rng_seed,
            "created": timezone.now().isoformat(timespec="seconds"),
            "counts": result.counts,
        },
    }
