from datetime import datetime, timedelta, tzinfo

from django.conf import settings
from django.db.models import Manager
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusters.models import Cluster, GpuModel, Scenario
from clusters.selectors import CatalogNames, catalog_names
from jobs.models import Job, JobEvent, Priority, job_name_validator
from jobs.selectors import API_JOB_FIELDS
from jobs.services.submit import MAX_ENV
from portal.core.serializers import NO_NUL, SlugRef, StrictCharField, StrictIntegerField
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
    gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS)
    nodes = StrictIntegerField(min_value=1, max_value=MAX_NODES, default=1)
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


class CatalogNameField(serializers.CharField):
    """The slug (a partition: the name) of the catalog row the job names by `<kind>_id`: the
    schema's field. JobOut reads the names itself (job_answer)."""

    def __init__(self, kind: str, **kwargs) -> None:
        self.kind = kind
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance: Job) -> Job:
        return instance

    def to_representation(self, job: Job) -> str:
        return getattr(catalog_names([job]), self.kind)[getattr(job, f"{self.kind}_id")]


GPU_HOURS = {"max_digits": 12, "decimal_places": 4, "coerce_to_string": False}
GPU_HOURS_RESERVED = {"max_digits": 12, "decimal_places": 2, "coerce_to_string": False}
# Their to_representation reads only their own settings: one of each rounds every answer's value.
_gpu_hours = serializers.DecimalField(**GPU_HOURS)
_gpu_hours_reserved = serializers.DecimalField(**GPU_HOURS_RESERVED)


class JobListOut(serializers.ListSerializer):
    """A page of jobs: rows of jobs.selectors.API_JOB_FIELDS (a values() query), or jobs. The
    catalog's names for the whole page in one read."""

    def to_representation(self, data):
        if type(self.child) is not JobOut:  # JobDetailOut adds its fields to each answer
            return super().to_representation(data)
        rows = list(data.all() if isinstance(data, Manager) else data)
        names, tz = catalog_names(rows), timezone.get_current_timezone()
        return [job_answer(row if isinstance(row, dict) else job_row(row), names, tz) for row in rows]


class JobOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")
    scenario = CatalogNameField("scenario")
    gpu_model = CatalogNameField("gpu_model")
    cluster = CatalogNameField("cluster")
    partition = CatalogNameField("partition")
    submitted_by = serializers.CharField(source="submitted_by.username", default=None, allow_null=True)
    gpu_hours = serializers.DecimalField(**GPU_HOURS, allow_null=True)
    gpu_hours_reserved = serializers.DecimalField(source="reserved_gpu_hours", **GPU_HOURS_RESERVED)

    class Meta:
        model = Job
        list_serializer_class = JobListOut
        fields = [
            "id",
            "tenant",
            "name",
            "scenario",
            "gpu_model",
            "gpus",
            "nodes",
            "walltime_minutes",
            "priority",
            "state",
            "reason",
            "cluster",
            "partition",
            "backend_id",
            "submitted_by",
            "created",
            "started_at",
            "finished_at",
            "exit_code",
            "gpu_hours",
            "gpu_hours_reserved",
        ]

    def to_representation(self, job: Job) -> dict:
        row = job if isinstance(job, dict) else job_row(job)
        return job_answer(row, catalog_names([row]), timezone.get_current_timezone())


def job_row(job: Job) -> dict:
    """A job as a row of API_JOB_FIELDS, as the list reads them (jobs.selectors)."""
    return {
        "id": job.pk,
        "tenant__slug": job.tenant.slug,
        **{name: getattr(job, name) for name in _PLAIN_FIELDS},
        "submitted_by__username": job.submitted_by.username if job.submitted_by_id else None,
    }


_PLAIN_FIELDS = [name for name in API_JOB_FIELDS if "__" not in name and name != "id"]


def job_answer(row: dict, names: CatalogNames, tz: tzinfo) -> dict:
    """JobOut's answer, built straight from a row of API_JOB_FIELDS. DRF's walk over the fields
    took 2.8 ms of a page of 50 and building the fields 0.9 ms more (docs/performance.md); this
    reads plain columns as they are and rounds the decimals as DRF's DecimalField does.
    tests/test_job_answer.py holds it equal to DRF's walk on jobs in every state."""
    gpu_hours = row["gpu_hours"]
    return {
        "id": str(row["id"]),
        "tenant": row["tenant__slug"],
        "name": row["name"],
        "scenario": names.scenario[row["scenario_id"]],
        "gpu_model": names.gpu_model[row["gpu_model_id"]],
        "gpus": row["gpus"],
        "nodes": row["nodes"],
        "walltime_minutes": row["walltime_minutes"],
        "priority": row["priority"],
        "state": row["state"],
        "reason": row["reason"],
        "cluster": names.cluster[row["cluster_id"]],
        "partition": names.partition[row["partition_id"]],
        "backend_id": row["backend_id"],
        "submitted_by": row["submitted_by__username"],
        "created": _iso(row["created"], tz),
        "started_at": _iso(row["started_at"], tz),
        "finished_at": _iso(row["finished_at"], tz),
        "exit_code": row["exit_code"],
        "gpu_hours": None if gpu_hours is None else _gpu_hours.to_representation(gpu_hours),
        "gpu_hours_reserved": _gpu_hours_reserved.to_representation(row["reserved_gpu_hours"]),
    }


def _iso(when: datetime | None, tz: tzinfo) -> str | None:
    """DRF's DateTimeField (ISO 8601, in the current time zone, UTC as Z), less its lookup of
    the time zone for each value."""
    if when is None:
        return None
    text = when.astimezone(tz).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


DETAIL_FIELDS = ["raw_state", "node_list", "template", "parameters", "env", "script"]


class JobDetailOut(JobOut):
    """A job; the fields beyond JobOut's only for its submitter and the tenant's owners and managers
    (GET /jobs/{id}/ answers JobOut to the others), hence optional in the schema."""

    class Meta(JobOut.Meta):
        fields = [*JobOut.Meta.fields, *DETAIL_FIELDS]
        extra_kwargs = {name: {"required": False} for name in DETAIL_FIELDS}

    def to_representation(self, job: Job) -> dict:
        return super().to_representation(job) | {name: getattr(job, name) for name in DETAIL_FIELDS}


class JobEventOut(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason", "raw_state"]


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


class UsageIn(serializers.Serializer):
    """Query parameters tenant, from, to (dates; default the last 30 days) and group_by."""

    def get_fields(self):
        # `from` is a Python keyword, so the fields are declared here rather than as attributes.
        return {
            "tenant": StrictCharField(required=False, default=""),
            "from": UsageDateField(required=False, default=None),
            "to": UsageDateField(required=False, default=None),
            "group_by": serializers.ChoiceField(choices=["day", "user", "gpu_model"], default="day"),
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


class UsageRowOut(serializers.Serializer):
    key = serializers.CharField()
    gpu_hours = serializers.FloatField()


class UsageOut(serializers.Serializer):
    results = UsageRowOut(many=True)
