import django_filters

from jobs.models import Job, JobState


class JobFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    scenario = django_filters.CharFilter(field_name="scenario__slug")
    cluster = django_filters.CharFilter(field_name="cluster__slug")
    submitted_by = django_filters.CharFilter(field_name="submitted_by__username")
    created_after = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created", lookup_expr="lt")

    class Meta:
        model = Job
        fields = ["tenant", "state", "scenario", "cluster", "submitted_by", "created_after", "created_before"]
