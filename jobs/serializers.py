from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from decimal import Decimal
from functools import cache
from operator import itemgetter
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Manager
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing import money
from billing.models import BudgetPeriod
from billing.serializers import PositiveMoneyIn
from clusters.models import Cluster, GpuModel, Scenario
from clusters.selectors import CatalogNames, catalog_names
from clusters.shares import ShareKind
from jobs.costs import costs_of
from jobs.models import Job, JobEvent, JobGpuSample, Loan, LoanRole, Priority, job_name_validator
from jobs.selectors import API_JOB_DETAIL_FIELDS, JOB_ANSWER, LENDING_DAYS_MAX, USAGE_GROUPS
from jobs.services.submit import MAX_ENV
from portal.core.serializers import (
    ID_LOOKUP,
    NO_NUL,
    SlugRef,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
)
from tenants.models import Tier
from tenants.serializers import VisibleTenantField

MAX_GPUS = 4096
MAX_NODES = 512


@extend_schema_field(
    {
        "type": "object",
        "maxProperties": MAX_ENV,
        "additionalProperties": {"type": "string", "maxLength": 4096, "pattern": NO_NUL},
        "description": "Variable names: a letter or _, then letters, digits, _; not the scheduler's own.",
    }
)
class EnvField(serializers.DictField):
    def __init__(self, **kwargs):
        super().__init__(
            child=StrictCharField(max_length=4096, allow_blank=True, trim_whitespace=False), **kwargs
        )


class JobIn(serializers.Serializer):
    tenant = VisibleTenantField()
    scenario = SlugRef(queryset=Scenario.objects.all())
    gpu_model = SlugRef(queryset=GpuModel.objects.all())
    gpus = StrictIntegerField(
        min_value=1,
        max_value=MAX_GPUS,
        help_text="Units of the share: devices, MIG instances, slices or shards.",
    )
    nodes = StrictIntegerField(min_value=1, max_value=MAX_NODES, default=1)
    share = serializers.ChoiceField(
        choices=ShareKind.choices,
        default=ShareKind.WHOLE,
        help_text="What each of `gpus` is; the partition must offer it (GET /clusters/). Shards share a "
        "device without isolation.",
    )
    mig_profile = StrictCharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=32,
        help_text="share=mig: the profile, e.g. 3g.71gb.",
    )
    gpu_memory_mib = StrictIntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=1 << 24,
        help_text="share=slice: the memory cap in MiB.",
    )
    gpu_cores_pct = StrictIntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=100,
        help_text="share=slice: the compute percentage.",
    )
    preemptible = StrictBooleanField(
        required=False,
        default=False,
        help_text="May run on GPUs that other tenants of its tenant's cohort lend, beyond its own grant; "
        "such a job is warned (Slurm USR1, Kubernetes SIGTERM) and stopped when they are reclaimed, "
        "and resumes from its checkpoint as its next attempt.",
    )
    max_restarts = StrictIntegerField(
        required=False,
        default=None,
        allow_null=True,
        min_value=0,
        max_value=settings.JOB_MAX_RESTARTS,
        help_text="Restarts after PREEMPTED or NODE_FAIL (or FAILED with restart_exit_codes). "
        "Default: 3 for a preemptible job, else 0.",
    )
    restart_exit_codes = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=255),
        required=False,
        default=list,
        max_length=8,
        help_text="Exit codes of a FAILED attempt that restart it (needs max_restarts ≥ 1).",
    )
    walltime_minutes = StrictIntegerField(min_value=1)  # at most the site's cap: get_fields()
    name = StrictCharField(max_length=64, validators=[job_name_validator])
    priority = serializers.ChoiceField(
        choices=Priority.choices, default="", help_text="Default: normal, or the tenant's tier cap if lower."
    )
    env = EnvField(default=dict)
    script = StrictCharField(
        required=False,
        default="",
        trim_whitespace=False,
        max_length=65536,
        help_text="Starts with #!; at most 64 KiB in UTF-8. Give a script, or a template with parameters.",
    )
    template = StrictCharField(required=False, default="", max_length=64)
    parameters = serializers.DictField(required=False, default=dict)
    cluster = SlugRef(queryset=Cluster.objects.filter(enabled=True), required=False, default=None)
    partition = StrictCharField(required=False, default="", max_length=64)

    def get_fields(self):
        # The site's walltime cap, as it is now (a setting), in the validation and the schema.
        fields = super().get_fields()
        fields["walltime_minutes"] = StrictIntegerField(
            min_value=1, max_value=settings.JOB_MAX_WALLTIME_MINUTES
        )
        return fields


@extend_schema_field({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 255}})
class ExitCodesField(serializers.Field):
    """Job.restart_exit_codes ("1,42") as a list of integers."""

    def __init__(self, **kwargs):
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: str) -> list[int]:
        return [int(code) for code in value.split(",") if code]


class CatalogNameField(serializers.CharField):
    """The slug (a partition: the name) of the catalog row the job names by `<kind>_id`. DRF's
    walk reads it for one job; the answer built from a row reads the whole page's (job_answer)."""

    def __init__(self, kind: str, **kwargs) -> None:
        self.kind = kind
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance: Job) -> Job:
        return instance

    def to_representation(self, job: Job) -> str:
        return getattr(catalog_names([job]), self.kind)[getattr(job, f"{self.kind}_id")]


class JobListOut(serializers.ListSerializer):
    """A page of jobs, or of rows of their columns (a values() query: the API's list reads rows),
    with the catalog's names for the whole page in one read."""

    def to_representation(self, data) -> list[dict]:
        serializer_class = type(self.child)
        jobs = data.all() if isinstance(data, Manager) else data
        rows = [job if isinstance(job, dict) else job_row(job, serializer_class) for job in jobs]
        names, tz = catalog_names(rows), timezone.get_current_timezone()
        costs = costs_of((row["id"], row) for row in rows)
        return [job_answer(row, names, tz, serializer_class, cost=costs[row["id"]]) for row in rows]


# Fields of the answer that are no column: computed from the row (job_answer).
COMPUTED = ("cost", "currency")


@extend_schema_field({"type": "string", "format": "decimal", "pattern": r"^-?\d+(\.\d+)?$"})
class CostField(serializers.Field):
    """A job's cost, from the job itself (source "*"): jobs.costs.costs_of, shown by billing.money."""

    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, job) -> str:
        return money.as_api(costs_of([(job.pk, job)])[job.pk])


@extend_schema_field({"type": "string", "pattern": "^[A-Z]{3}$"})
class CurrencyField(serializers.Field):
    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, job) -> str:
        return money.currency()


# A job's answer: the fields of jobs.selectors.JOB_ANSWER, each read from its column there. A
# column of the job is shown as ModelSerializer maps its model field; the fields declared here
# are shown otherwise, their source that column in DRF's spelling. The schema is these fields;
# each answer is built from a row of the columns (job_answer), equal to what DRF's walk over
# these fields answers (tests/jobs/test_job_answer.py). (No docstring: it would be the schema's.)
class JobOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")
    scenario = CatalogNameField("scenario")
    gpu_model = CatalogNameField("gpu_model")
    cluster = CatalogNameField("cluster")
    partition = CatalogNameField("partition")
    submitted_by = serializers.CharField(source="submitted_by.username", default=None, allow_null=True)
    gpu_hours = serializers.DecimalField(
        max_digits=12, decimal_places=4, coerce_to_string=False, allow_null=True
    )
    gpu_hours_reserved = serializers.DecimalField(
        source="reserved_gpu_hours", max_digits=12, decimal_places=2, coerce_to_string=False
    )
    device_fraction = serializers.DecimalField(
        max_digits=5,
        decimal_places=4,
        coerce_to_string=False,
        help_text="What each of `gpus` counts of a device: GPU-hours are gpus × device_fraction × hours.",
    )
    restart_exit_codes = ExitCodesField()
    attempt = serializers.IntegerField(help_text="Its current attempt, from 1: each restart is the next.")
    gpus_borrowed = serializers.IntegerField(
        help_text="How many of its GPUs its current attempt took on loan from other tenants of its cohort."
    )
    gpu_hours_lost = serializers.DecimalField(
        max_digits=12,
        decimal_places=4,
        coerce_to_string=False,
        help_text="GPU-hours its stopped attempts ran past their last checkpoint: lost, not charged.",
    )
    stop_at = serializers.DateTimeField(
        allow_null=True, help_text="Set once it was warned (reclaimed by its lender): when it is stopped."
    )
    restart_after = serializers.DateTimeField(
        allow_null=True, help_text="A restarted job waits for admission until then (backoff)."
    )
    tier = serializers.ChoiceField(
        choices=Tier.choices,
        help_text="The tenant's tier when the job was submitted: its prices' multiplier.",
    )
    cost = CostField(
        help_text="What its GPU-hours cost at the prices in force while it ran (so far while it runs), "
        "in `currency`, a decimal string rounded half to even to the currency's minor unit "
        "(docs/cost-model.md).",
    )
    currency = CurrencyField(help_text="The site's currency, ISO 4217.")

    class Meta:
        model = Job
        list_serializer_class = JobListOut
        fields = [*JOB_ANSWER, *COMPUTED]

    def to_representation(self, job: Job | dict) -> dict:
        row = job if isinstance(job, dict) else job_row(job, type(self))
        return job_answer(row, catalog_names([row]), timezone.get_current_timezone(), type(self))


class JobDetailOut(JobOut):
    """A job; the fields beyond JobOut's only for its submitter and the tenant's owners and managers
    (GET /jobs/{id}/ answers JobOut to the others), hence optional in the schema."""

    class Meta(JobOut.Meta):
        fields = [*JOB_ANSWER, *API_JOB_DETAIL_FIELDS, *COMPUTED]
        extra_kwargs = {name: {"required": False} for name in API_JOB_DETAIL_FIELDS}


# DRF fields that show a value as the database gives it (a CharField too, of a text column).
AS_STORED = (serializers.IntegerField, serializers.ChoiceField, serializers.JSONField)


class AnswerPlan(NamedTuple):
    """A serializer's answer as built from a row of its columns: the fields in order, each read
    from its column; then the fields not shown as stored, by how they are shown."""

    fields: tuple[str, ...]
    columns: tuple[str, ...]
    read: Callable[[dict], tuple]  # itemgetter(*columns): a row's columns at C speed
    names: tuple[tuple[str, str], ...]  # (field, kind): the catalog's name by the row's id
    times: tuple[str, ...]  # datetimes: DRF's ISO 8601, without its time-zone lookup per value
    shown: tuple[tuple[str, Callable[[Any], Any]], ...]  # the rest: the DRF field's to_representation


@cache
def answer_plan(serializer_class: type[JobOut]) -> AnswerPlan:
    """The serializer's answer plan, made once from its fields: DRF's walk over the fields cost a
    page of 50 2.8 ms, and building the fields (a deep copy of the declared ones) 0.9 ms more
    (docs/performance.md)."""
    fields, columns, names, times, shown = [], [], [], [], []
    for name, field in serializer_class().fields.items():
        if name in COMPUTED:
            continue
        column = JOB_ANSWER.get(name, name)
        catalog = isinstance(field, CatalogNameField)
        read = f"{field.kind}_id" if catalog else "__".join(field.source_attrs)
        if read != column:
            raise ImproperlyConfigured(
                f"{serializer_class.__name__}.{name} reads {read}; jobs.selectors.JOB_ANSWER says {column}"
            )
        fields.append(name)
        columns.append(column)
        if catalog:
            names.append((name, field.kind))
        elif isinstance(field, serializers.DateTimeField):
            times.append(name)
        elif not is_stored_as_shown(field, column):
            shown.append((name, shown_by(field)))
    plan = (tuple(fields), tuple(columns), itemgetter(*columns), tuple(names), tuple(times), tuple(shown))
    return AnswerPlan(*plan)


def is_stored_as_shown(field: serializers.Field, column: str) -> bool:
    """Does the database give this field's column of a job (tenant__slug: through the relation)
    as DRF shows it?"""
    if type(field) in AS_STORED:
        return True
    if type(field) is not serializers.CharField:
        return False
    model, *relations, name = Job, *column.split("__")
    for relation in relations:
        model = model._meta.get_field(relation).related_model
    return isinstance(model._meta.get_field(name), models.CharField | models.TextField)


def shown_by(field: serializers.Field) -> Callable[[Any], Any]:
    """The field's to_representation; None stays None where the field may be null (DRF's walk
    shows None without asking the field)."""
    show = field.to_representation
    if not field.allow_null:
        return show
    return lambda value: None if value is None else show(value)


def iso_datetime(when: datetime | None, tz: tzinfo) -> str | None:
    """DRF's DateTimeField with its default format: ISO 8601, in the current time zone, UTC as Z."""
    if when is None:
        return None
    text = when.astimezone(tz).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def job_answer(
    row: dict,
    names: CatalogNames,
    tz: tzinfo,
    serializer_class: type[JobOut] = JobOut,
    *,
    cost: Decimal | None = None,
) -> dict:
    """The serializer's answer built straight from a row of its columns (a values() query's dict,
    or job_row's), with the catalog's names of the page and the current time zone; its cost as
    given (a page's, computed at once by jobs.costs.costs_of), or computed here."""
    plan = answer_plan(serializer_class)
    answer = dict(zip(plan.fields, plan.read(row), strict=True))
    if cost is None:
        cost = costs_of([(row["id"], row)])[row["id"]]
    answer["cost"], answer["currency"] = money.as_api(cost), money.currency()
    for name, kind in plan.names:
        answer[name] = getattr(names, kind)[answer[name]]
    for name in plan.times:
        answer[name] = iso_datetime(answer[name], tz)
    for name, show in plan.shown:
        answer[name] = show(answer[name])
    return answer


def job_row(job: Job, serializer_class: type[JobOut] = JobOut) -> dict:
    """The job as a row of the columns the serializer's answer reads, as a values() query gives
    them: a related column (tenant__slug) through its relation, None where that is None."""
    row = {}
    for column in answer_plan(serializer_class).columns:
        value = job
        for attr in column.split("__"):
            value = None if value is None else getattr(value, attr)
        row[column] = value
    return row


class JobEventOut(serializers.ModelSerializer):
    # The event stream's id of the same event (docs/api.md, Live events): a client that read the
    # history here resumes the stream from its last one with Last-Event-ID.
    id = serializers.CharField(read_only=True)

    class Meta:
        model = JobEvent
        fields = ["id", "at", "from_state", "to_state", "reason", "raw_state"]


class JobGpuSampleOut(serializers.ModelSerializer):
    memory_used_pct = serializers.FloatField(allow_null=True, read_only=True)

    class Meta:
        model = JobGpuSample
        fields = [
            "at",
            "gpus",
            "utilization_pct",
            "utilization_min_pct",
            "utilization_max_pct",
            "memory_used_mib",
            "memory_total_mib",
            "memory_used_pct",
            "temperature_c",
            "power_w",
            "xid",
        ]


class LogIn(serializers.Serializer):
    tail = serializers.IntegerField(min_value=1, max_value=5000, default=100)


class LogOut(serializers.Serializer):
    lines = serializers.ListField(child=serializers.CharField())
    truncated = serializers.BooleanField()


class TemplateOut(serializers.Serializer):
    slug = serializers.CharField()
    scenario = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    parameters_schema = serializers.JSONField()


class TemplatePageOut(serializers.Serializer):
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = TemplateOut(many=True)


@extend_schema_field({"type": "string", "format": "date", "pattern": r"^2[0-9]{3}-"})
class UsageDateField(serializers.DateField):
    """A date in the years 2000 to 2999 (UsageIn.validate)."""


class RangeIn(serializers.Serializer):
    """Query parameters from and to: dates of the site's time zone in the years 2000 to 2999,
    by default the 30 days up to today, at most 367 days; a subclass adds its own in `more`."""

    more: dict = {}

    def get_fields(self):
        # `from` is a Python keyword, so the fields are declared here rather than as attributes.
        return {
            "from": UsageDateField(required=False, default=None),
            "to": UsageDateField(required=False, default=None),
            **{name: field() for name, field in self.more.items()},
        }

    def validate(self, data):
        for name in ("from", "to"):
            if data[name] is not None and not 2000 <= data[name].year <= 2999:
                raise serializers.ValidationError({name: ["A date between 2000 and 2999."]})
        data["to"] = data["to"] or timezone.localdate()
        data["from"] = data["from"] or data["to"] - timedelta(days=29)
        if data["from"] > data["to"]:
            raise serializers.ValidationError({"from": ["Must not be after `to`."]})
        if (data["to"] - data["from"]).days > 366:
            raise serializers.ValidationError({"from": ["At most 366 days at a time."]})
        return data


class UsageIn(RangeIn):
    """Query parameters tenant, from, to (dates; default the last 30 days) and group_by."""

    more = {
        "tenant": lambda: StrictCharField(required=False, default=""),
        "group_by": lambda: serializers.ChoiceField(choices=USAGE_GROUPS, default="day"),
    }


class UsageRowOut(serializers.Serializer):
    key = serializers.CharField()
    gpu_hours = serializers.FloatField()
    cost = serializers.DecimalField(
        max_digits=30,
        decimal_places=2,
        help_text="What these GPU-hours cost at the prices in force while they were used, in `currency`, "
        "rounded half to even to the currency's minor unit.",
    )


class UsageOut(serializers.Serializer):
    currency = serializers.CharField(help_text="ISO 4217 code of every `cost`.")
    results = UsageRowOut(many=True)


# --- Lending between the tenants of a cohort (jobs.selectors.lending_of, TenantLoanViewSet)


class LendingIn(serializers.Serializer):
    days = serializers.IntegerField(
        min_value=1,
        max_value=LENDING_DAYS_MAX,
        default=30,
        help_text=f"The days the series and the totals cover, up to now: 1 to {LENDING_DAYS_MAX}.",
    )


class LendingPartitionOut(serializers.Serializer):
    """A cohort's partition as the cohorts API names it (its cluster's slug, its name there)."""

    cluster = serializers.CharField()
    name = serializers.CharField()


class LendingCohortOut(serializers.Serializer):
    cohort = serializers.CharField()
    gpu_model = serializers.CharField()
    partition = LendingPartitionOut(allow_null=True, help_text="null: every partition of the GPU model.")
    reclaim_grace_s = serializers.IntegerField()
    lending_limit = serializers.IntegerField()
    borrowing_limit = serializers.IntegerField()
    lent_gpus = serializers.IntegerField(help_text="GPUs of the tenant's lent to others now.")
    borrowed_gpus = serializers.IntegerField(help_text="GPUs the tenant's jobs hold on loan now.")


class LendingDayOut(serializers.Serializer):
    date = serializers.DateField(help_text="A UTC day; the first and the last are partial.")
    lent_gpu_hours = serializers.FloatField()
    borrowed_gpu_hours = serializers.FloatField()
    reclaimed = serializers.IntegerField(help_text="Loans of the tenant's, either way, reclaimed that day.")


class LendingOut(serializers.Serializer):
    tenant = serializers.CharField()
    cohorts = LendingCohortOut(many=True)
    lent_gpus = serializers.IntegerField()
    borrowed_gpus = serializers.IntegerField()
    days = serializers.IntegerField()
    lent_gpu_hours = serializers.FloatField()
    borrowed_gpu_hours = serializers.FloatField()
    reclaimed_from_borrowers = serializers.IntegerField(
        help_text="Loans of its GPUs it took back from borrowed jobs within the days."
    )
    reclaimed_from_us = serializers.IntegerField(
        help_text="Loans its own borrowed jobs lost to their lenders within the days."
    )
    daily = LendingDayOut(many=True, help_text="One row per UTC day, oldest first: days + 1 rows.")


# Not an enum in the schema: an enum of a field named `role` would take the name RoleEnum from the
# tenant roles' (drf-spectacular names enums by field), which clients already use.
@extend_schema_field({"type": "string", "pattern": "^(lent|borrowed)$"})
class LoanRoleField(serializers.ChoiceField):
    pass


class LoanOut(serializers.ModelSerializer):
    """A loan as one of its two tenants sees it; the other tenant is named to staff only."""

    id = serializers.CharField(read_only=True)
    cohort = serializers.CharField(source="cohort.slug", allow_null=True)  # null: the cohort was deleted
    role = LoanRoleField(
        choices=LoanRole.choices, help_text="`lent` or `borrowed`, as the tenant of the path."
    )
    gpu_hours = serializers.DecimalField(
        max_digits=14,
        decimal_places=4,
        coerce_to_string=False,
        help_text="GPUs × hours lent: until now while the loan is open.",
    )
    job = serializers.CharField(
        source="job_shown",
        allow_null=True,
        help_text="The borrowing job (the tenant's own) when role is borrowed; null when lent.",
    )
    counterpart = serializers.CharField(
        allow_null=True, help_text="The other tenant's slug, for staff who see every tenant; else null."
    )

    class Meta:
        model = Loan
        fields = [
            "id", "cohort", "role", "gpus", "started_at", "ended_at", "reclaimed", "gpu_hours", "job",
            "counterpart",
        ]  # fmt: skip
        read_only_fields = fields  # so that the schema says each is always there


# --- Budgets (docs/api.md, Budgets)


class MoneyField(serializers.CharField):
    """An amount as a decimal string rounded half to even to the currency's minor unit."""

    def to_representation(self, value) -> str:
        return money.as_api(value)


class BudgetOut(serializers.Serializer):
    """A budget with its figures in its current period (jobs.budgets.BudgetStatus)."""

    id = serializers.CharField(source="budget.pk")
    period = serializers.ChoiceField(source="budget.period", choices=BudgetPeriod.choices)
    grant = serializers.CharField(source="budget.grant_id", allow_null=True)
    amount = MoneyField(source="budget.amount")
    hard = serializers.BooleanField(source="budget.hard")
    currency = serializers.SerializerMethodField()
    period_start = serializers.DateField()
    period_end = serializers.DateField(
        allow_null=True, help_text="A month's next first day; a grant's last day."
    )
    spent = MoneyField(help_text="The cost of the GPU-hours charged in the period.")
    reserved = MoneyField(help_text="What the GPU-hours of waiting and running jobs would cost now.")
    left = MoneyField(help_text="amount − spent − reserved; negative once passed.")
    percent = serializers.SerializerMethodField(help_text="(spent + reserved) / amount × 100, to 0.1.")

    @extend_schema_field(serializers.CharField())
    def get_currency(self, row) -> str:
        return money.currency()

    @extend_schema_field(serializers.FloatField())
    def get_percent(self, row) -> float:
        return float(round(row.percent, 1))


class BudgetPageOut(serializers.Serializer):
    """Every budget of the tenant on one page (a monthly one and one per grant at most)."""

    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = BudgetOut(many=True)


class BudgetIn(serializers.Serializer):
    period = serializers.ChoiceField(choices=BudgetPeriod.choices)
    grant = StrictCharField(
        required=False, allow_null=True, default=None, validators=[RegexValidator(f"^{ID_LOOKUP}$")],
        help_text="The tenant's grant (its id) of a budget per grant; null for a monthly one.",
    )  # fmt: skip
    amount = PositiveMoneyIn(help_text='In the site\'s currency, a decimal string: "1200.00".')
    hard = StrictBooleanField(required=False, default=False)


class BudgetPatch(serializers.Serializer):
    """Either or both; a budget's period and grant stay (delete it and make another)."""

    amount = PositiveMoneyIn(required=False)
    hard = StrictBooleanField(required=False)
