"""The price list and the budgets. Money is Decimal everywhere and rounded only where it is
shown (billing/money.py); docs/cost-model.md is the page a finance office reads."""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from clusters.models import GpuModel
from clusters.shares import ShareKind
from tenants.models import QuotaGrant, Tenant, Tier

# A price per device-GPU-hour and a multiplier carry 4 decimals; a budget 2 (the currency's cents).
PRICE_PLACES = 4
AMOUNT_PLACES = 2


class Price(models.Model):
    """What one device-GPU-hour of a model (and share kind) costs from `effective_from` on, until
    the next row of the same model and share. A row once in force is never changed or deleted:
    a new price is a new row, so a price change never rewrites the past."""

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="prices")
    share = models.CharField(max_length=8, choices=ShareKind.choices, default=ShareKind.WHOLE)
    per_gpu_hour = models.DecimalField(
        max_digits=12,
        decimal_places=PRICE_PLACES,
        validators=[MinValueValidator(Decimal(0))],
        help_text=_("Price of one device-GPU-hour in the site's currency"),
    )
    effective_from = models.DateTimeField(help_text=_("When the price comes into force"))
    note = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["gpu_model__slug", "share", "effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_model", "share", "effective_from"], name="one_price_at_a_time"
            ),
            models.CheckConstraint(condition=Q(per_gpu_hour__gte=0), name="price_not_negative"),
        ]

    def __str__(self) -> str:
        since = f"{self.effective_from:%Y-%m-%d %H:%M}"
        return f"{self.gpu_model.slug}/{self.share} {self.per_gpu_hour} from {since}"


class TierMultiplier(models.Model):
    """What a tenant's tier multiplies its prices by, from `effective_from` on. A tier without a
    row in force pays 1×."""

    tier = models.CharField(max_length=16, choices=Tier.choices)
    multiplier = models.DecimalField(
        max_digits=8, decimal_places=PRICE_PLACES, validators=[MinValueValidator(Decimal(0))]
    )
    effective_from = models.DateTimeField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tier", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["tier", "effective_from"], name="one_multiplier_at_a_time"),
            models.CheckConstraint(condition=Q(multiplier__gte=0), name="multiplier_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.tier} ×{self.multiplier} from {self.effective_from:%Y-%m-%d %H:%M}"


class BudgetPeriod(models.TextChoices):
    MONTH = "month", _("Per calendar month")
    GRANT = "grant", _("Per grant")


# The shares of a budget spent at which its tenant's owners and managers are told, in percent.
THRESHOLDS = (50, 80, 100)


class Budget(models.Model):
    """What a tenant may spend: each calendar month, or over one grant's life. Spent counts the
    cost of the GPU-hours used and the reserved GPU-hours of running and waiting jobs. A hard
    budget refuses new jobs once they would pass it (409 budget_exhausted); running jobs go on."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    grant = models.ForeignKey(
        QuotaGrant, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    amount = models.DecimalField(
        max_digits=14, decimal_places=AMOUNT_PLACES, validators=[MinValueValidator(Decimal("0.01"))]
    )
    hard = models.BooleanField(default=False, help_text=_("Refuse new jobs once spent"))
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__slug", "period", "grant_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(period="month"), name="one_monthly_budget_per_tenant"
            ),
            models.UniqueConstraint(fields=["grant"], name="one_budget_per_grant"),
            models.CheckConstraint(
                condition=(Q(period="month", grant__isnull=True) | Q(period="grant", grant__isnull=False)),
                name="budget_grant_iff_per_grant",
            ),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug} {self.period} {self.amount}"

    def clean(self) -> None:
        if self.period == BudgetPeriod.GRANT and self.grant_id is None:
            raise ValidationError({"grant": _("A budget per grant names its grant.")})
        if self.period == BudgetPeriod.MONTH and self.grant_id is not None:
            raise ValidationError({"grant": _("A monthly budget names no grant.")})
        if self.grant_id is not None and self.grant.tenant_id != self.tenant_id:
            raise ValidationError({"grant": _("The grant belongs to another tenant.")})


class BudgetNotice(models.Model):
    """A threshold of a budget its tenant was told of, once per period (a month's first day, or
    the grant's start)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="notices")
    period_start = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    spent = models.DecimalField(max_digits=18, decimal_places=8)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["budget_id", "period_start", "threshold"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start", "threshold"], name="one_notice_per_threshold"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget} {self.period_start} {self.threshold}%"
