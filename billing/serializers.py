"""The price list in the API: exact decimal strings, in the site's currency."""

from decimal import Decimal

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
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


class MoneyIn(serializers.DecimalField):
    """An amount in: a decimal string ("1200.50"), as amounts go out, never a JSON number (a
    binary float on the way is how cents get lost); at most `decimal_places` places, not
    negative. Its schema's pattern says exactly that (MoneyInSchema)."""

    def __init__(self, *, max_digits: int = 14, decimal_places: int = 2, **kwargs):
        kwargs.setdefault("min_value", Decimal(0))
        super().__init__(
            max_digits=max_digits, decimal_places=decimal_places, coerce_to_string=True, **kwargs
        )

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class PositiveMoneyIn(MoneyIn):
    """An amount in that must be more than nothing (a budget)."""

    def __init__(self, **kwargs):
        super().__init__(min_value=Decimal("0.01"), **kwargs)


class MoneyInSchema(OpenApiSerializerFieldExtension):
    """The pattern of a MoneyIn from its own digits: at most max_digits − decimal_places before
    the point and decimal_places after it, not negative, and more than 0 where it must be."""

    target_class = MoneyIn
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        places, whole = self.target.decimal_places, self.target.max_digits - self.target.decimal_places
        fraction = rf"(\.[0-9]{{1,{places}}})?"
        if self.target.min_value is not None and self.target.min_value > 0:
            pattern = rf"^(0\.[0-9]{{0,{places - 1}}}[1-9]|[1-9][0-9]{{0,{whole - 1}}}{fraction})$"
        else:
            pattern = rf"^[0-9]{{1,{whole}}}{fraction}$"
        return {"type": "string", "format": "decimal", "pattern": pattern, "example": "1200.00"}
