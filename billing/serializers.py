"""The price list in the API: exact decimal strings, in the site's currency."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing import money, selectors
from billing.models import Price, TierMultiplier


class PriceOut(serializers.ModelSerializer):
    gpu_model = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=4, coerce_to_string=True)
    currency = serializers.SerializerMethodField()
    until = serializers.DateTimeField(allow_null=True)
    in_force = serializers.SerializerMethodField()

    class Meta:
        model = Price
        fields = [
            "id",
            "gpu_model",
            "share",
            "per_gpu_hour",
            "currency",
            "effective_from",
            "until",
            "in_force",
            "note",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_currency(self, row) -> str:
        return money.currency()

    @extend_schema_field(serializers.BooleanField())
    def get_in_force(self, row) -> bool:
        return selectors.in_force(row, timezone.now())


class TierMultiplierOut(serializers.ModelSerializer):
    multiplier = serializers.DecimalField(max_digits=8, decimal_places=4, coerce_to_string=True)
    until = serializers.DateTimeField(allow_null=True)
    in_force = serializers.SerializerMethodField()

    class Meta:
        model = TierMultiplier
        fields = ["id", "tier", "multiplier", "effective_from", "until", "in_force"]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_in_force(self, row) -> bool:
        return selectors.in_force(row, timezone.now())
