import django_filters

from monitoring.models import Alert, AlertScope, AlertStatus, Severity


class AlertFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    status = django_filters.ChoiceFilter(choices=AlertStatus.choices)
    severity = django_filters.ChoiceFilter(choices=Severity.choices)
    scope = django_filters.ChoiceFilter(choices=AlertScope.choices)
    job = django_filters.NumberFilter(field_name="job_id", min_value=1, max_value=10**18 - 1)

    class Meta:
        model = Alert
        fields = ["tenant", "status", "severity", "scope", "job"]
