"""Statements, kept as they were made, and what the TCO view is told a cluster costs."""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from clusters.models import Cluster, GpuModel
from tenants.models import Tenant

NOT_NEGATIVE = [MinValueValidator(Decimal(0))]

# Exact money: a line's cost is GPU-hours (4 places) × price (4) × multiplier (4).
EXACT = {"max_digits": 30, "decimal_places": 12}


class Statement(models.Model):
    """One tenant's month: made once by beat on the 1st (or by a platform admin for a month that
    has ended) and never changed. Everything it shows is copied in, names included, so that it
    reads the same after the tenant's jobs, users, grants or prices change."""

    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.SET_NULL, related_name="statements")
    tenant_slug = models.CharField(max_length=63)
    tenant_name = models.CharField(max_length=200)
    month = models.DateField(help_text=_("The month's first day"))
    currency = models.CharField(max_length=3)
    jobs = models.PositiveIntegerField()
    gpu_hours = models.DecimalField(max_digits=18, decimal_places=4)
    cost = models.DecimalField(**EXACT)
    budget = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    # The grants the month drew on: [{id, scenario, gpu_model, share, gpus, gpu_hours, starts_on,
    # ends_on, gpu_hours_used}], as they stood when the statement was made.
    grants = models.JSONField(default=list)
    made_at = models.DateTimeField(auto_now_add=True)
    mailed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-month", "tenant_slug"]
        constraints = [
            # Per tenant, not per slug: a tenant deleted keeps its statements (tenant NULL), and a
            # new tenant that takes its slug gets statements of its own.
            models.UniqueConstraint(
                fields=["tenant", "month"],
                condition=Q(tenant__isnull=False),
                name="one_statement_per_tenant_month",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_slug} {self.month:%Y-%m}"


class StatementLine(models.Model):
    """A job's GPU-hours in the month under one price: a job that ran across a price change or
    a month's end has a line on each side."""

    statement = models.ForeignKey(Statement, on_delete=models.CASCADE, related_name="lines")
    job_id = models.BigIntegerField()
    job_name = models.CharField(max_length=64)
    username = models.CharField(max_length=150)
    gpu_model = models.CharField(max_length=63)
    gpu_model_name = models.CharField(max_length=64)
    scenario = models.CharField(max_length=63)
    scenario_name = models.CharField(max_length=200)
    cluster = models.CharField(max_length=63)
    partition = models.CharField(max_length=63)
    share = models.CharField(max_length=8)
    tier = models.CharField(max_length=16)
    grant_id = models.BigIntegerField(null=True)
    start = models.DateTimeField()
    end = models.DateTimeField()
    gpu_hours = models.DecimalField(max_digits=18, decimal_places=4)
    unit_price = models.DecimalField(max_digits=12, decimal_places=4)
    multiplier = models.DecimalField(max_digits=8, decimal_places=4)
    cost = models.DecimalField(**EXACT)

    class Meta:
        ordering = ["statement_id", "start", "job_id", "id"]

    def __str__(self) -> str:
        return f"{self.statement} job {self.job_id} {self.gpu_hours}"


class TcoProfile(models.Model):
    """What owning GPUs costs a year, as a platform admin enters it: the purchase written off over
    its years, power at the site's PUE, staff and space. One per cluster, or one for the site
    (no cluster)."""

    name = models.CharField(max_length=100)
    cluster = models.OneToOneField(
        Cluster, null=True, blank=True, on_delete=models.CASCADE, related_name="tco"
    )
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    nodes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpus_per_node = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    node_price = models.DecimalField(max_digits=14, decimal_places=2, validators=NOT_NEGATIVE)
    depreciation_years = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(15)]
    )
    power_w_per_gpu = models.PositiveIntegerField(
        help_text=_("Average draw of a GPU and its share of the node")
    )
    electricity_per_kwh = models.DecimalField(max_digits=8, decimal_places=4, validators=NOT_NEGATIVE)
    pue = models.DecimalField(
        max_digits=4,
        decimal_places=2,
        validators=[MinValueValidator(Decimal(1)), MaxValueValidator(Decimal(3))],
    )
    staff_per_year = models.DecimalField(max_digits=14, decimal_places=2, validators=NOT_NEGATIVE)
    space_per_year = models.DecimalField(max_digits=14, decimal_places=2, validators=NOT_NEGATIVE)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster"], condition=Q(cluster__isnull=True), name="one_site_tco"
            ),
            models.CheckConstraint(condition=Q(pue__gte=1), name="pue_at_least_one"),
        ]

    def __str__(self) -> str:
        return self.name


class CloudPrice(models.Model):
    """What a cloud asks for one GPU-hour of a model, on demand, as the admin enters it."""

    profile = models.ForeignKey(TcoProfile, on_delete=models.CASCADE, related_name="cloud_prices")
    provider = models.CharField(max_length=64)
    per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, validators=NOT_NEGATIVE)

    class Meta:
        ordering = ["profile_id", "per_gpu_hour"]
        constraints = [models.UniqueConstraint(fields=["profile", "provider"], name="one_price_per_provider")]

    def __str__(self) -> str:
        return f"{self.provider} {self.per_gpu_hour}"
