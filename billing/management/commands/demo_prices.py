"""Demo prices for the embedded portal (idempotent): one price per GPU model from its relative
`cost_index` (H100-80GB = 100 → 18.00 per device-GPU-hour, an illustrative figure in the site's
currency), in force from the first of this year, tier multipliers (low 0.8, high 1.2, critical
1.5), and a soft monthly budget for the demo's protein-lab. A real site enters its own in the
console (docs/cost-model.md)."""

from datetime import datetime
from decimal import Decimal

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from billing.models import Budget, BudgetPeriod, Price, TierMultiplier
from clusters.models import GpuModel
from tenants.models import Tenant, Tier

PER_COST_INDEX_POINT = Decimal("0.18")
MULTIPLIERS = {Tier.LOW: Decimal("0.8"), Tier.HIGH: Decimal("1.2"), Tier.CRITICAL: Decimal("1.5")}
DEMO_BUDGET = ("protein-lab", Decimal(20000))


class Command(BaseCommand):
    help = "Load demo prices, tier multipliers and a budget (idempotent)."

    @transaction.atomic
    def handle(self, *args, **options):
        since = timezone.make_aware(datetime(timezone.localdate().year, 1, 1))
        for model in GpuModel.objects.all():
            Price.objects.get_or_create(
                gpu_model=model,
                share="whole",
                effective_from=since,
                defaults={"per_gpu_hour": model.cost_index * PER_COST_INDEX_POINT, "note": "demo"},
            )
        for tier, multiplier in MULTIPLIERS.items():
            TierMultiplier.objects.get_or_create(
                tier=tier, effective_from=since, defaults={"multiplier": multiplier}
            )
        slug, amount = DEMO_BUDGET
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is not None:
            Budget.objects.get_or_create(
                tenant=tenant, period=BudgetPeriod.MONTH, defaults={"amount": amount}
            )
        priced = Price.objects.values("gpu_model").distinct().count()
        self.stdout.write(f"Demo prices: {priced} GPU models priced (the console's price list changes them).")
