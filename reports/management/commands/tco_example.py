"""`manage.py tco_example [--rate R]`: the TCO example of published figures (reports/tco.py) as the
site's profile, in the site's currency (PORTAL_CURRENCY): its US-dollar amounts times R."""

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError

from billing import money
from portal.core.errors import PortalError
from reports.tco_profiles import tco_example_load


def rate_of(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise CommandError(f"--rate: not a number: {text!r}") from None


class Command(BaseCommand):
    help = "Load the TCO example of published figures as the site's profile."

    def add_arguments(self, parser):
        parser.add_argument(
            "--rate", type=rate_of, default=None,
            help="Units of the site's currency per US dollar (needed unless PORTAL_CURRENCY is USD).",
        )  # fmt: skip

    def handle(self, *args, rate=None, **options):
        try:
            profile = tco_example_load(actor=None, rate=rate)
        except PortalError as exc:
            errors = exc.extra.get("errors", {})
            named = [f"{field}: {' '.join(messages)}" for field, messages in errors.items()]
            raise CommandError(" ".join([exc.detail, *named])) from None
        self.stdout.write(f"TCO profile {profile.pk} ({profile.name}) loaded, in {money.currency()}.")
