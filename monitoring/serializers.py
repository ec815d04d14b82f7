"""Bodies of the alerts API and the Alertmanager webhook (docs/api.md, Additions: monitoring)."""

from rest_framework import serializers

from monitoring.models import Alert, AlertChannel, AlertStatus, ChannelKind, Delivery, Severity
from monitoring.notify import channel_url_problem
from portal.core.serializers import StrictCharField

MAX_ALERTS = 1000  # Alertmanager sends up to max_alerts per message (0: all of a group)
MAX_LABELS = 64


def _string_map(value, field_name: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise serializers.ValidationError(f"must be an object of at most {MAX_LABELS} strings")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 200 or len(item) > 4000 or "\x00" in key + item:
            raise serializers.ValidationError(f"{key[:50]!r}: a string of at most 4000 characters")
    return value


class StringMapField(serializers.Field):
    def to_internal_value(self, data):
        return _string_map(data, self.field_name)

    def to_representation(self, value):
        return value


class IncomingAlertIn(serializers.Serializer):
    status = serializers.ChoiceField(choices=AlertStatus.values)
    labels = StringMapField()
    annotations = StringMapField(required=False, default=dict)
    startsAt = serializers.DateTimeField()
    endsAt = serializers.CharField(required=False, allow_blank=True, default="")
    fingerprint = serializers.RegexField(r"^[0-9a-f]{1,64}$")

    def validate_labels(self, value):
        if not value.get("alertname"):
            raise serializers.ValidationError("needs an alertname")
        return value

    def validate_endsAt(self, value):
        """Alertmanager writes 0001-01-01T00:00:00Z while an alert fires: no end."""
        if not value or value.startswith("0001-"):
            return None
        return serializers.DateTimeField().to_internal_value(value)


class AlertmanagerMessageIn(serializers.Serializer):
    """Alertmanager's webhook body, version 4 (its documented format)."""

    version = serializers.ChoiceField(choices=["4"])
    status = serializers.ChoiceField(choices=AlertStatus.values, required=False)
    alerts = IncomingAlertIn(many=True, allow_empty=True, max_length=MAX_ALERTS)


class DeliveryOut(serializers.ModelSerializer):
    channel = serializers.CharField(source="channel.name", default=None, read_only=True)
    recipients = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        fields = ["id", "kind", "channel", "event", "title", "recipients", "status", "attempts", "last_error",
                  "created", "sent_at"]  # fmt: skip

    def get_recipients(self, delivery) -> int:
        """How many addresses a mail went to (the addresses themselves are not shown)."""
        return len(delivery.recipients)


class AlertOut(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    job = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = Alert
        fields = ["id", "name", "status", "severity", "scope", "tenant", "job", "cluster", "summary",
                  "runbook", "labels", "starts_at", "ends_at", "times_received", "received_last"]  # fmt: skip


class AlertDetailOut(AlertOut):
    deliveries = DeliveryOut(many=True, read_only=True)

    class Meta(AlertOut.Meta):
        fields = [*AlertOut.Meta.fields, "deliveries"]


class AlertChannelOut(serializers.ModelSerializer):
    """A channel as it is shown: never its URL nor its secret, only whether one is set."""

    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = AlertChannel
        fields = ["id", "name", "kind", "min_severity", "enabled", "has_secret", "created"]

    def get_has_secret(self, channel) -> bool:
        return bool(channel.secret)


class AlertChannelIn(serializers.Serializer):
    name = StrictCharField(max_length=100)
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    url = StrictCharField(max_length=2000, write_only=True)
    secret = StrictCharField(max_length=500, required=False, allow_blank=True, default="", write_only=True)
    min_severity = serializers.ChoiceField(choices=Severity.choices, required=False, default=Severity.WARNING)
    enabled = serializers.BooleanField(required=False, default=True)

    def validate(self, data):
        instance = self.instance
        kind = data.get("kind", instance.kind if instance else None)
        url = data.get("url", instance.url if instance else "")
        if ("url" in data or "kind" in data) and (problem := channel_url_problem(kind, url)):
            raise serializers.ValidationError({"url": [f"The URL {problem}."]})
        secret = data.get("secret", instance.secret if instance else "")
        if kind == ChannelKind.WEBHOOK and not secret:
            raise serializers.ValidationError(
                {"secret": ["A webhook needs a secret to sign its posts with."]}
            )
        return data


class AlertChannelPatch(AlertChannelIn):
    """Any of a channel's fields, the others kept (an empty body changes nothing)."""

    name = StrictCharField(max_length=100, required=False)
    kind = serializers.ChoiceField(choices=ChannelKind.choices, required=False)
    url = StrictCharField(max_length=2000, write_only=True, required=False)
    secret = StrictCharField(max_length=500, required=False, allow_blank=True, write_only=True)
    min_severity = serializers.ChoiceField(choices=Severity.choices, required=False)
    enabled = serializers.BooleanField(required=False)
