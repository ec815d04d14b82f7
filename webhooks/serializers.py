"""The webhook API's bodies and answers (docs/api.md, Webhooks)."""

from rest_framework import serializers

from portal.core.serializers import StrictBooleanField, StrictCharField
from webhooks.models import Delivery, Endpoint
from webhooks.services import SUBSCRIBABLE


class WebhookEndpointOut(serializers.ModelSerializer):
    """An endpoint as it is shown: never its URL's secret parts, never its signing secret."""

    id = serializers.CharField(read_only=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "url",
            "description",
            "events",
            "enabled",
            "disabled_reason",
            "failing_since",
            "created",
        ]

    def get_url(self, endpoint) -> str:
        """Scheme, host and path: a query may carry a receiver's key, so it is not shown back."""
        return endpoint.shown_url


class WebhookEndpointCreatedOut(WebhookEndpointOut):
    """The answer to a create (or a rotation): the signing secret, shown this once."""

    secret = serializers.CharField()

    class Meta(WebhookEndpointOut.Meta):
        fields = [*WebhookEndpointOut.Meta.fields, "secret"]


class WebhookEndpointIn(serializers.Serializer):
    url = StrictCharField(max_length=2000)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=SUBSCRIBABLE), min_length=1, max_length=10
    )
    description = StrictCharField(max_length=200, required=False, default="", allow_blank=True)


class WebhookEndpointPatch(serializers.Serializer):
    """Any of these; the others kept. `rotate_secret: true` makes a new secret, answered once."""

    url = StrictCharField(max_length=2000, required=False)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=SUBSCRIBABLE), min_length=1, max_length=10, required=False
    )
    description = StrictCharField(max_length=200, required=False, allow_blank=True)
    enabled = StrictBooleanField(required=False)
    rotate_secret = StrictBooleanField(required=False, default=False)


class WebhookDeliveryOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    redelivery_of = serializers.CharField(source="redelivery_of_id", allow_null=True)

    class Meta:
        model = Delivery
        fields = [
            "id", "event_type", "status", "attempts", "response_status", "last_error", "created",
            "last_attempt_at", "next_attempt_at", "delivered_at", "redelivery_of", "payload",
        ]  # fmt: skip


class NotificationsIO(serializers.Serializer):
    job_end_mail = StrictBooleanField()
