"""What the reports' API takes and gives; money as decimal strings (billing/money.py)."""

import re
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing import money
from billing.serializers import MoneyIn
from clusters.models import Cluster, GpuModel
from jobs.serializers import RangeIn
from portal.core.serializers import SlugRef, StrictCharField, StrictDecimalField, StrictIntegerField
from reports.models import Statement, StatementLine
from reports.site import TABLES
from tenants.models import Tenant

# --- Statements

MONTH_PATTERN = r"^2[0-9]{3}-(0[1-9]|1[0-2])$"  # the years 2000–2999, as dates elsewhere
# An amount as the API gives it: a decimal string rounded to the currency's minor unit, half to
# even (billing.money.as_api); `*_exact` fields give the unrounded value.
MONEY_SCHEMA = {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?$", "example": "1234.50"}


@extend_schema_field(MONEY_SCHEMA)
class StatementMoney(serializers.Field):
    def to_representation(self, value):
        return money.as_api(value)


@extend_schema_field(MONEY_SCHEMA)
class StatementExact(serializers.Field):
    """An exact amount (12 decimal places as kept), normalized: no trailing zeros."""

    def to_representation(self, value):
        return None if value is None else format(value.normalize(), "f")


@extend_schema_field({"type": "string", "pattern": MONTH_PATTERN, "maxLength": 7, "example": "2025-01"})
class StatementMonthField(serializers.Field):
    """A month as `YYYY-MM`; its value is the month's first day."""

    default_error_messages = {"invalid": "A month as YYYY-MM."}

    def to_internal_value(self, data):
        if not isinstance(data, str) or re.fullmatch(MONTH_PATTERN, data) is None:
            self.fail("invalid")
        return date(int(data[:4]), int(data[5:]), 1)

    def to_representation(self, value):
        return f"{value:%Y-%m}"


@extend_schema_field({"type": "string", "pattern": MONTH_PATTERN})
class StatementMonthOut(serializers.Field):
    def to_representation(self, value):
        return f"{value:%Y-%m}"


class StatementOut(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant_slug", read_only=True)
    month = StatementMonthOut(read_only=True)
    gpu_hours = serializers.DecimalField(
        max_digits=18, decimal_places=4, coerce_to_string=True, read_only=True
    )
    cost = StatementMoney(read_only=True)
    cost_exact = StatementExact(source="cost", read_only=True)
    budget = StatementMoney(read_only=True, allow_null=True)

    class Meta:
        model = Statement
        fields = [
            "id", "tenant", "tenant_name", "month", "currency", "jobs", "gpu_hours", "cost", "cost_exact",
            "budget", "made_at", "mailed_at",
        ]  # fmt: skip
        read_only_fields = fields


class StatementLineOut(serializers.ModelSerializer):
    gpu_hours = serializers.DecimalField(
        max_digits=18, decimal_places=4, coerce_to_string=True, read_only=True
    )
    unit_price = serializers.DecimalField(
        max_digits=12, decimal_places=4, coerce_to_string=True, read_only=True
    )
    multiplier = serializers.DecimalField(
        max_digits=8, decimal_places=4, coerce_to_string=True, read_only=True
    )
    cost = StatementMoney(read_only=True)
    cost_exact = StatementExact(source="cost", read_only=True)

    class Meta:
        model = StatementLine
        fields = [
            "job_id", "job_name", "username", "gpu_model", "gpu_model_name", "scenario", "scenario_name",
            "cluster", "partition", "share", "tier", "grant_id", "start", "end", "gpu_hours", "unit_price",
            "multiplier", "cost", "cost_exact",
        ]  # fmt: skip
        read_only_fields = fields


class StatementSummaryOut(serializers.Serializer):
    key = serializers.CharField(help_text="The GPU model's or scenario's slug, or the username.")
    name = serializers.CharField()
    jobs = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=4, coerce_to_string=True)
    cost = StatementMoney()
    cost_exact = StatementExact(source="cost")


class StatementTotalsOut(serializers.Serializer):
    jobs = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=18, decimal_places=4, coerce_to_string=True)
    cost = StatementMoney()
    cost_exact = StatementExact(source="cost")
    budget = StatementMoney(allow_null=True)
    budget_left = StatementMoney(allow_null=True)
    budget_used_pct = serializers.DecimalField(
        max_digits=12, decimal_places=1, coerce_to_string=True, allow_null=True
    )


class StatementGrantOut(serializers.Serializer):
    """A grant the month drew on, as it stood when the statement was made."""

    id = serializers.IntegerField()
    scenario = serializers.CharField()
    gpu_model = serializers.CharField()
    share = serializers.CharField()
    gpus = serializers.IntegerField()
    gpu_hours = serializers.CharField()
    starts_on = serializers.CharField()
    ends_on = serializers.CharField()
    gpu_hours_used = serializers.CharField()
    month_gpu_hours = serializers.CharField(help_text="GPU-hours the month's lines drew on it.")
    month_cost = serializers.CharField(help_text="What they cost, exact.")


class StatementDetailOut(StatementOut):
    grants = StatementGrantOut(many=True, read_only=True)
    totals = serializers.SerializerMethodField()
    by_gpu_model = serializers.SerializerMethodField()
    by_scenario = serializers.SerializerMethodField()
    by_user = serializers.SerializerMethodField()
    lines = serializers.SerializerMethodField()

    class Meta(StatementOut.Meta):
        fields = [
            *StatementOut.Meta.fields, "grants", "totals", "by_gpu_model", "by_scenario", "by_user", "lines",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(StatementTotalsOut)
    def get_totals(self, statement) -> dict:
        return StatementTotalsOut(self.context["summaries"]["totals"]).data

    @extend_schema_field(StatementSummaryOut(many=True))
    def get_by_gpu_model(self, statement) -> list:
        return StatementSummaryOut(self.context["summaries"]["by_gpu_model"], many=True).data

    @extend_schema_field(StatementSummaryOut(many=True))
    def get_by_scenario(self, statement) -> list:
        return StatementSummaryOut(self.context["summaries"]["by_scenario"], many=True).data

    @extend_schema_field(StatementSummaryOut(many=True))
    def get_by_user(self, statement) -> list:
        return StatementSummaryOut(self.context["summaries"]["by_user"], many=True).data

    @extend_schema_field(StatementLineOut(many=True))
    def get_lines(self, statement) -> list:
        return StatementLineOut(self.context["lines"], many=True).data


class StatementIn(serializers.Serializer):
    tenant = SlugRef(queryset=Tenant.objects.all())
    month = StatementMonthField(help_text="The month as YYYY-MM; it must have ended.")


class StatementDownloadIn(serializers.Serializer):
    lang = serializers.ChoiceField(choices=["en", "zh-hans"], required=False)


# --- Site report


class SiteReportIn(RangeIn):
    """from, to (as GET /usage/ takes them) and top: how many tenants and users the top lists hold."""

    more = {"top": lambda: StrictIntegerField(required=False, default=10, min_value=1, max_value=100)}


class SiteReportCsvIn(SiteReportIn):
    more = {
        **SiteReportIn.more,
        "table": lambda: serializers.ChoiceField(choices=TABLES, default="usage", help_text="The table."),
    }


@extend_schema_field(MONEY_SCHEMA)
class SiteMoney(serializers.Field):
    def to_representation(self, value):
        return money.as_api(value)


class SiteUsageRowOut(serializers.Serializer):
    key = serializers.CharField(help_text="The slug, `cluster/partition`, username or ISO date.")
    gpu_hours = serializers.FloatField()
    cost = SiteMoney()


class SiteUsageOut(serializers.Serializer):
    tenant = SiteUsageRowOut(many=True)
    gpu_model = SiteUsageRowOut(many=True)
    scenario = SiteUsageRowOut(many=True)
    cluster = SiteUsageRowOut(many=True)
    partition = SiteUsageRowOut(many=True)
    day = SiteUsageRowOut(many=True)


class SiteUtilizationRowOut(serializers.Serializer):
    partition = serializers.CharField(help_text="`cluster/partition`")
    day = serializers.DateField()
    gpus = serializers.IntegerField(help_text="The partition's GPUs, as the catalog has them now.")
    allocated_gpu_hours = serializers.FloatField(help_text="Device-GPU-hours jobs held that day.")
    allocated_pct = serializers.FloatField(allow_null=True, help_text="Of gpus × the day's hours (to now).")
    telemetry_pct = serializers.FloatField(
        allow_null=True, help_text="Mean utilization of the GPUs the telemetry read; null without readings."
    )


class SiteWaitRowOut(serializers.Serializer):
    key = serializers.CharField()
    jobs = serializers.IntegerField()
    mean_s = serializers.FloatField()
    p50_s = serializers.FloatField()
    p90_s = serializers.FloatField()


class SiteWaitsOut(serializers.Serializer):
    scenario = SiteWaitRowOut(many=True)
    tier = SiteWaitRowOut(many=True)


class SiteTopOut(serializers.Serializer):
    tenants = SiteUsageRowOut(source="top_tenants", many=True)
    users = SiteUsageRowOut(source="top_users", many=True)


class SiteReportOut(serializers.Serializer):
    """reports.site.SiteReport as the API gives it."""

    def get_fields(self):
        # `from` is a Python keyword, so the fields are declared here rather than as attributes.
        return {
            "from": serializers.DateField(source="start"),
            "to": serializers.DateField(source="end"),
            "currency": serializers.CharField(help_text="ISO 4217 code of every `cost`."),
            "gpu_hours": serializers.FloatField(),
            "cost": SiteMoney(),
            "usage": SiteUsageOut(),
            "utilization": SiteUtilizationRowOut(many=True),
            "waits": SiteWaitsOut(),
            "top": SiteTopOut(source="*"),
        }


# --- TCO
# A TCO profile's money, in: a decimal string ("300000.00"), never a JSON number (a float's
# binary fraction would reach the figures); out: as_api's string, rounded half to even.
TCO_MONEY_SCHEMA = {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]+)?$", "example": "300000.00"}


class TcoMoneyIn(MoneyIn):
    """An amount of the TCO view: a decimal string (billing.serializers.MoneyIn)."""

    def __init__(self, *, max_digits: int, decimal_places: int, **kwargs):
        super().__init__(max_digits=max_digits, decimal_places=decimal_places, **kwargs)


@extend_schema_field(TCO_MONEY_SCHEMA)
class TcoMoneyOut(serializers.Field):
    def to_representation(self, value):
        return money.as_api(value)


def tco_ratio(**kwargs) -> serializers.DecimalField:
    """A ratio out (utilization 0–1, a break-even point, a %): a JSON number, 4 or 2 places, half
    to even."""
    kwargs.setdefault("decimal_places", 4)
    return serializers.DecimalField(
        max_digits=None, coerce_to_string=False, rounding=ROUND_HALF_EVEN, read_only=True, **kwargs
    )


class CloudPriceIn(serializers.Serializer):
    provider = StrictCharField(max_length=64)
    per_gpu_hour = TcoMoneyIn(max_digits=10, decimal_places=4)

    def validate(self, attrs):
        # A PATCH parses its body partially, and that reaches the rows of cloud_prices too.
        missing = {"provider", "per_gpu_hour"} - set(attrs)
        if missing:
            raise serializers.ValidationError({name: ["This field is required."] for name in sorted(missing)})
        return attrs


class TcoProfileIn(serializers.Serializer):
    """A profile's figures. PATCH takes any of them; `cloud_prices` then replaces all prices."""

    name = StrictCharField(max_length=100)
    cluster = SlugRef(
        queryset=Cluster.objects.all(), allow_null=True, required=False, default=None,
        help_text="The cluster's slug, or null for the whole site (every cluster).",
    )  # fmt: skip
    gpu_model = SlugRef(queryset=GpuModel.objects.all())
    nodes = StrictIntegerField(min_value=1, max_value=100_000)
    gpus_per_node = StrictIntegerField(min_value=1, max_value=64)
    node_price = TcoMoneyIn(max_digits=14, decimal_places=2, help_text="Purchase price of one node.")
    depreciation_years = StrictIntegerField(min_value=1, max_value=15)
    power_w_per_gpu = StrictIntegerField(
        min_value=1, max_value=10_000, help_text="Average draw of a GPU and its share of the node, in W."
    )
    electricity_per_kwh = TcoMoneyIn(max_digits=8, decimal_places=4)
    pue = StrictDecimalField(max_digits=4, decimal_places=2, min_value=Decimal(1), max_value=Decimal(3))
    staff_per_year = TcoMoneyIn(max_digits=14, decimal_places=2)
    space_per_year = TcoMoneyIn(max_digits=14, decimal_places=2)
    cloud_prices = CloudPriceIn(many=True, required=False, max_length=20)


@extend_schema_field({"type": "string", "format": "decimal", "pattern": r"^(0(\.[0-9]{1,4})?|1(\.0{1,4})?)$"})
class UtilizationIn(serializers.DecimalField):
    """0 to 1 with at most 4 places: the schema says so, not only the field's checks."""


class TcoQuery(serializers.Serializer):
    utilization = UtilizationIn(
        max_digits=5, decimal_places=4, min_value=Decimal(0), max_value=Decimal(1), required=False,
        help_text="What-if utilization, 0 to 1, instead of the measured one.",
    )  # fmt: skip


class TcoExampleIn(serializers.Serializer):
    rate = serializers.DecimalField(
        max_digits=12, decimal_places=6, min_value=Decimal("0.000001"), required=False,
        help_text="The site's currency per US dollar; needed unless the site's currency is USD.",
    )  # fmt: skip


class CloudComparisonOut(serializers.Serializer):
    provider = serializers.CharField(read_only=True)
    per_gpu_hour = serializers.DecimalField(
        max_digits=10, decimal_places=4, coerce_to_string=True, read_only=True
    )
    break_even_utilization = tco_ratio(source="break_even", allow_null=True)
    never_breaks_even = serializers.BooleanField(read_only=True)
    cloud_yearly_cost = TcoMoneyOut(source="cloud_yearly", read_only=True)
    saving_pct = tco_ratio(decimal_places=2, allow_null=True)


class TcoFiguresOut(serializers.Serializer):
    yearly_cost = TcoMoneyOut(source="figures.yearly.total", read_only=True)
    yearly_depreciation = TcoMoneyOut(source="figures.yearly.depreciation", read_only=True)
    yearly_power = TcoMoneyOut(source="figures.yearly.power", read_only=True)
    yearly_staff = TcoMoneyOut(source="figures.yearly.staff", read_only=True)
    yearly_space = TcoMoneyOut(source="figures.yearly.space", read_only=True)
    gpu_hours_available = tco_ratio(source="figures.gpu_hours_available")
    gpu_hours_delivered = tco_ratio(source="figures.gpu_hours_delivered")
    utilization_measured = tco_ratio(source="measured_utilization")
    utilization = tco_ratio(source="figures.utilization")
    utilization_source = serializers.SerializerMethodField()
    cost_per_gpu_hour = TcoMoneyOut(source="figures.cost_per_gpu_hour", read_only=True, allow_null=True)

    def get_utilization_source(self, row) -> str:
        return "override" if row.overridden else "measured"


class TcoProfileOut(serializers.Serializer):
    """A profile (its figures as entered) and what follows from them."""

    id = serializers.CharField(source="profile.pk", read_only=True)
    name = serializers.CharField(source="profile.name", read_only=True)
    cluster = serializers.CharField(source="profile.cluster.slug", read_only=True, allow_null=True)
    gpu_model = serializers.CharField(source="profile.gpu_model.slug", read_only=True)
    nodes = serializers.IntegerField(source="profile.nodes", read_only=True)
    gpus_per_node = serializers.IntegerField(source="profile.gpus_per_node", read_only=True)
    node_price = TcoMoneyOut(source="profile.node_price", read_only=True)
    depreciation_years = serializers.IntegerField(source="profile.depreciation_years", read_only=True)
    power_w_per_gpu = serializers.IntegerField(source="profile.power_w_per_gpu", read_only=True)
    electricity_per_kwh = serializers.DecimalField(
        source="profile.electricity_per_kwh",
        max_digits=8,
        decimal_places=4,
        coerce_to_string=True,
        read_only=True,
    )
    pue = serializers.DecimalField(
        source="profile.pue", max_digits=4, decimal_places=2, coerce_to_string=False, read_only=True
    )
    staff_per_year = TcoMoneyOut(source="profile.staff_per_year", read_only=True)
    space_per_year = TcoMoneyOut(source="profile.space_per_year", read_only=True)
    currency = serializers.SerializerMethodField()
    cloud_prices = CloudComparisonOut(source="figures.clouds", many=True, read_only=True)
    figures = TcoFiguresOut(source="*", read_only=True)
    updated = serializers.DateTimeField(source="profile.updated", read_only=True)
    updated_by = serializers.CharField(source="profile.updated_by.username", read_only=True, allow_null=True)

    def get_currency(self, row) -> str:
        return money.currency()
