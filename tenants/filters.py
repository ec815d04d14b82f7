import django_filters
from django.utils import timezone

from portal.core.models import AuditEvent
from tenants.models import QuotaGrant, QuotaRequest, RequestState


class QuotaRequestFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    state = django_filters.ChoiceFilter(choices=RequestState.choices)

    class Meta:
        model = QuotaRequest
        fields = ["tenant", "state"]


class QuotaFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    active = django_filters.BooleanFilter(method="filter_active")

    class Meta:
        model = QuotaGrant
        fields = ["tenant", "active"]

    def filter_active(self, queryset, name, value):
        today = timezone.localdate()
        window = {"starts_on__lte": today, "ends_on__gte": today}
        return queryset.filter(**window) if value else queryset.exclude(**window)


class AuditFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant_slug")
    action = django_filters.CharFilter()

    class Meta:
        model = AuditEvent
        fields = ["tenant", "action"]
