import django_filters
from drf_spectacular.utils import extend_schema_field

from monitoring.models import Alert, AlertScope, AlertStatus, Severity


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 10**18 - 1})
class IdFilter(django_filters.NumberFilter):
    """A job id: the schema says what the filter accepts (1 to 18 digits), so that a client
    knows 0 and -1 are refused."""


class AlertFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    status = django_filters.ChoiceFilter(choices=AlertStatus.choices)
    severity = django_filters.ChoiceFilter(choices=Severity.choices)
    scope = django_filters.ChoiceFilter(choices=AlertScope.choices)
    job = IdFilter(field_name="job_id", min_value=1, max_value=10**18 - 1)

    class Meta:
        model = Alert
        fields = ["tenant", "status", "severity", "scope", "job"]
