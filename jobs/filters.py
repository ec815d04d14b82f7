from datetime import UTC, datetime
from functools import cache

import django_filters
from django.http import QueryDict

from jobs.models import Job, JobState, Loan, LoanRole
from tenants.filters import StrictBooleanFilter


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time with any offset that RFC 3339 allows (up to ±23:59), compared in UTC:
    PostgreSQL refuses an offset beyond ±15:59 with an error, which would be a 500."""

    def filter(self, qs, value):
        if value is not None:
            try:
                value = value.astimezone(UTC)
            except OverflowError:  # before year 1 or after 9999 once in UTC: the ends of time
                value = datetime.min if value.year == 1 else datetime.max
                value = value.replace(tzinfo=UTC)
        return super().filter(qs, value)


class SharedFilters(django_filters.FilterSet):
    """A FilterSet whose filters, and so their form fields, are made once per class, not per
    request: django-filter deep-copies every filter on each instance and builds a new form class
    from them, a fifth of what a page of jobs cost in the web process (docs/performance.md).
    Only for filters that keep nothing of a request: no `method`, no queryset of the request."""

    def __init__(self, data=None, queryset=None, *, request=None, prefix=None):
        self.is_bound = data is not None
        self.data = data or QueryDict()
        self.queryset = self._meta.model._default_manager.all() if queryset is None else queryset
        self.request = request
        self.form_prefix = prefix
        self.filters = self.base_filters  # shared, read only: model set once (_share)

    def get_form_class(self):
        return _form_class(type(self))

    @classmethod
    def _share(cls) -> None:
        for filter_ in cls.base_filters.values():
            if filter_.method is not None:
                raise TypeError(f"{cls.__name__}.{filter_.field_name}: a method filter cannot be shared")
            filter_.model = cls._meta.model


@cache
def _form_class(filterset: type[SharedFilters]) -> type:
    fields = {name: filter_.field for name, filter_ in filterset.base_filters.items()}
    return type(f"{filterset.__name__}Form", (filterset._meta.form,), fields)


class JobFilter(SharedFilters):
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    # distinct=False: state is the job's own column, so no join can repeat a row, and DISTINCT
    # over a job list costs the planner 5 ms a request on a site of 100,000 jobs.
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, distinct=False)
    scenario = django_filters.CharFilter(field_name="scenario__slug")
    cluster = django_filters.CharFilter(field_name="cluster__slug")
    submitted_by = django_filters.CharFilter(field_name="submitted_by__username")
    created_after = UtcDateTimeFilter(field_name="created", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created", lookup_expr="lt")

    class Meta:
        model = Job
        fields = ["tenant", "state", "scenario", "cluster", "submitted_by", "created_after", "created_before"]


JobFilter._share()


class LoanFilter(django_filters.FilterSet):
    """Filters of a tenant's loans; `role` is the list's own annotation (TenantLoanViewSet)."""

    role = django_filters.ChoiceFilter(choices=LoanRole.choices, help_text="As the tenant of the path.")
    open = StrictBooleanFilter(
        field_name="ended_at", lookup_expr="isnull", help_text="true: loans not ended; false: ended ones."
    )

    class Meta:
        model = Loan
        fields = ["role", "open"]
