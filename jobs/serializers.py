from datetime import datetime, timedelta, tzinfo

from django.conf import settings
from django.db.models import Manager
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusters.models import Cluster, GpuModel, Scenario
from clusters.selectors import catalog_names
from jobs.models import Job, JobEvent, Priority, job_name_validator
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
    """The slug (a partition: the name) of the catalog row the job names by `<kind>_id`. The
    names come from one query per answer (clusters.selectors.catalog_names), kept in the
    serializer's context: JobListOut reads them for the whole page at once."""

    def __init__(self, kind: str, **kwargs) -> None:
        self.kind = kind
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance: Job) -> Job:
        return instance

    def to_representation(self, job: Job) -> str:
        if Job._meta.get_field(self.kind).is_cached(job):  # a job just made holds its catalog rows
            row = getattr(job, self.kind)
            return row.name if self.kind == "partition" else row.slug
        pk = getattr(job, f"{self.kind}_id")
        names = self.context.get(CATALOG_NAMES)
        if names is None or pk not in getattr(names, self.kind):
            names = self.context[CATALOG_NAMES] = catalog_names([job])
        return getattr(names, self.kind)[pk]


CATALOG_NAMES = "catalog_names"


class JobListOut(serializers.ListSerializer):
    def to_representation(self, data):
        jobs = list(data.all() if isinstance(data, Manager) else data)
        self.context[CATALOG_NAMES] = catalog_names(jobs)
        return super().to_representation(jobs)


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
        """DRF's answer, built straight from the row. DRF's walk over the fields took 2.8 ms of a
        page of 50, the most of the list's answer (docs/performance.md); this one reads plain
        columns as they are and hands only dates, decimals and catalog names to their fields.
        tests/test_job_answer.py holds it equal to DRF's walk on jobs in every state."""
        fields, tz = self.fields, timezone.get_current_timezone()
        return {
            "id": str(job.pk),
            "tenant": job.tenant.slug,
            "name": job.name,
            "scenario": fields["scenario"].to_representation(job),
            "gpu_model": fields["gpu_model"].to_representation(job),
            "gpus": job.gpus,
            "nodes": job.nodes,
            "walltime_minutes": job.walltime_minutes,
            "priority": job.priority,
            "state": job.state,
            "reason": job.reason,
            "cluster": fields["cluster"].to_representation(job),
            "partition": fields["partition"].to_representation(job),
            "backend_id": job.backend_id,
            "submitted_by": job.submitted_by.username if job.submitted_by_id else None,
            "created": _iso(job.created, tz),
            "started_at": _iso(job.started_at, tz),
            "finished_at": _iso(job.finished_at, tz),
            "exit_code": job.exit_code,
            "gpu_hours": _shown(fields["gpu_hours"], job.gpu_hours),
            "gpu_hours_reserved": _shown(fields["gpu_hours_reserved"], job.reserved_gpu_hours),
        }


def _iso(when: datetime | None, tz: tzinfo) -> str | None:
    """DRF's DateTimeField (ISO 8601, in the current time zone, UTC as Z), less its lookup of
    the time zone for each value."""
    if when is None:
        return None
    text = when.astimezone(tz).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _shown(field: serializers.Field, value):
    return None if value is None else field.to_representation(value)


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
