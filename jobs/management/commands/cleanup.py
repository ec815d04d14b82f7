"""`manage.py cleanup <name> [--dry-run]`: run one cleanup service by hand and print its report."""

import json

from django.core.management.base import BaseCommand, CommandParser

from jobs import services

# The beat tasks' names (jobs.tasks), so that ops type what docs/periodic-tasks.md lists.
SERVICES = {
    "cap_walltime": services.jobs_cap_walltime,
    "end_grants": services.grants_end,
    "hold_suspended_tenants": services.tenants_hold_suspended,
    "purge_scratch": services.scratch_purge,
    "find_orphans": services.orphans_find,
    "apply_retention": services.retention_apply,
}


class Command(BaseCommand):
    help = "Run one cleanup service now and print its report (docs/periodic-tasks.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        names = sorted(SERVICES) + sorted(name.replace("_", "-") for name in SERVICES)
        parser.add_argument(
            "name", choices=names, metavar="name", help=f"one of: {', '.join(sorted(SERVICES))}"
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="report what it would do and change nothing (default: settings.CLEANUP_DRY_RUN)",
        )

    def handle(self, *args, name: str, dry_run: bool, **options) -> None:
        name = name.replace("-", "_")
        report = SERVICES[name](dry_run=True if dry_run else None)
        mode = "dry run: nothing was changed" if report.dry_run else "done"
        self.stdout.write(f"cleanup {name} ({mode})")
        self.stdout.write(json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str))
