import time

from django.core.cache import cache
from django.core.management.base import BaseCommand, CommandError

from portal.core.tasks import HEARTBEAT_KEY


class Command(BaseCommand):
    help = "Exit non-zero unless a worker ran beat's heartbeat within --max-age seconds (a healthcheck)."

    def add_arguments(self, parser):
        parser.add_argument("--max-age", type=int, default=180)

    def handle(self, *args, max_age: int, **options):
        stamp = cache.get(HEARTBEAT_KEY)
        if stamp is None:
            raise CommandError("no heartbeat recorded yet")
        age_s = time.time() - stamp
        if age_s > max_age:
            raise CommandError(f"last heartbeat {age_s:.0f}s ago (limit {max_age}s)")
        self.stdout.write(f"heartbeat {age_s:.0f}s ago")
