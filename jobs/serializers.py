from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from clusters.models import Cluster, GpuModel, Scenario
from jobs.models import Job, JobEvent, Priority, job_name_validator
from tenants.serializers import VisibleTenantField

MAX_GPUS = 4096
MAX_NODES = 512


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF would turn 5 or true into "5" or "True" silently."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class JobIn(serializers.Serializer):
    tenant = VisibleTenantField()
    scenario = serializers.SlugRelatedField(slug_field="slug", queryset=Scenario.objects.all())
    gpu_model = serializers.SlugRelatedField(slug_field="slug", queryset=GpuModel.objects.all())
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS)
    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES, default=1)
    walltime_minutes = serializers.IntegerField(min_value=1, max_value=365 * 24 * 60)
    name = serializers.CharField(max_length=64, validators=[job_name_validator])
    priority = serializers.ChoiceField(
        choices=Priority.choices, default="", help_text="Default: normal, or the tenant's tier cap if lower."
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=4096, allow_blank=True, trim_whitespace=False), default=dict
    )
    script = serializers.CharField(required=False, default="", trim_whitespace=False, max_length=65536)
    template = serializers.CharField(required=False, default="", max_length=64)
    parameters = serializers.DictField(required=False, default=dict)
    cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.filter(enabled=True), required=False, default=None
    )
    partition = serializers.CharField(required=False, default="", max_length=64)


class JobOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")
    scenario = serializers.CharField(source="scenario.slug")
    gpu_model = serializers.CharField(source="gpu_model.slug")
    cluster = serializers.CharField(source="cluster.slug")
    partition = serializers.CharField(source="partition.name")
    submitted_by = serializers.CharField(source="submitted_by.username", default=None)
    gpu_hours = serializers.DecimalField(
        max_digits=12, decimal_places=4, coerce_to_string=False, allow_null=True
    )
    gpu_hours_reserved = serializers.DecimalField(
        source="reserved_gpu_hours", max_digits=12, decimal_places=2, coerce_to_string=False
    )

    class Meta:
        model = Job
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


class JobDetailOut(JobOut):
    class Meta(JobOut.Meta):
        fields = [*JobOut.Meta.fields, "raw_state", "node_list", "template", "parameters", "env", "script"]


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


class UsageIn(serializers.Serializer):
    """Query parameters tenant, from, to (dates; default the last 30 days) and group_by."""

    def get_fields(self):
        # `from` is a Python keyword, so the fields are declared here rather than as attributes.
        return {
            "tenant": serializers.CharField(required=False, default=""),
            "from": serializers.DateField(required=False, default=None),
            "to": serializers.DateField(required=False, default=None),
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
