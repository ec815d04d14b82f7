import django_filters
from django import forms
from django.utils import timezone

from portal.core.models import AuditEvent
from tenants.models import QuotaGrant, QuotaRequest, RequestState


class QuotaRequestFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    state = django_filters.ChoiceFilter(choices=RequestState.choices)

    class Meta:
        model = QuotaRequest
        fields = ["tenant", "state"]


class _TrueOrFalse(forms.Field):
    """`true` or `false` (the schema's boolean), or nothing. Django's NullBooleanField reads
    anything else as nothing, so that a typo would silently list every grant."""

    widget = forms.TextInput  # the raw text: NullBooleanSelect has already mapped junk to None

    def to_python(self, value):
        if value in (None, ""):
            return None
        if value not in ("true", "false"):
            raise forms.ValidationError("Must be true or false.", code="invalid")
        return value == "true"


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = _TrueOrFalse


class QuotaFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    active = StrictBooleanFilter(method="filter_active")

    class Meta:
        model = QuotaGrant
        fields = ["tenant", "active"]

    def filter_active(self, queryset, name, value):
        today = timezone.localdate()
        return queryset.active_on(today) if value else queryset.inactive_on(today)


class AuditFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant_slug")
    action = django_filters.CharFilter()

    class Meta:
        model = AuditEvent
        fields = ["tenant", "action"]
