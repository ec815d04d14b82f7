"""The price list, read-only to everyone signed in (docs/api.md, Cost). Admins change it in the
console, where a price in force is never edited: a new price is a new row."""

import re

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.exceptions import ValidationError

from billing import selectors
from billing.serializers import PriceOut, TierMultiplierOut
from clusters.shares import ShareKind
from portal.core.pagination import CursorPage
from portal.core.serializers import SLUG_LOOKUP

SLUG_LOOKUP_RE = re.compile(SLUG_LOOKUP)


class ById(CursorPage):
    ordering = "id"


@extend_schema(
    parameters=[
        OpenApiParameter(
            "gpu_model", {"type": "string", "pattern": f"^{SLUG_LOOKUP}$"}, description="A GPU model's slug"
        ),
        OpenApiParameter("share", str, enum=ShareKind.values),
    ]
)
class PriceViewSet(viewsets.ReadOnlyModelViewSet):
    """Prices per device-GPU-hour, each from its `effective_from` until the next one's."""

    serializer_class = PriceOut
    pagination_class = ById

    def get_queryset(self):
        gpu_model = self.request.query_params.get("gpu_model", "")
        share = self.request.query_params.get("share", "")
        if gpu_model and not SLUG_LOOKUP_RE.fullmatch(gpu_model):
            raise ValidationError({"gpu_model": ["Not a GPU model's slug."]})
        if share and share not in ShareKind.values:
            raise ValidationError({"share": [f"One of {', '.join(ShareKind.values)}."]})
        return selectors.price_list(gpu_model=gpu_model, share=share)


class TierMultiplierViewSet(viewsets.ReadOnlyModelViewSet):
    """What each tier multiplies its prices by, from `effective_from` on (1 without a row)."""

    serializer_class = TierMultiplierOut
    pagination_class = ById

    def get_queryset(self):
        return selectors.multiplier_list()
