"""The list filters of the reports' API."""

import django_filters
from django.core.validators import RegexValidator

from reports.models import Statement

# --- Statements

MONTH_FILTER = RegexValidator(r"^[0-9]{4}-(0[1-9]|1[0-2])$", "A month as YYYY-MM.")


class StatementFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant_slug", max_length=63)
    month = django_filters.CharFilter(method="filter_month", max_length=7, validators=[MONTH_FILTER])

    class Meta:
        model = Statement
        fields = ["tenant", "month"]

    def filter_month(self, queryset, name, value):
        return queryset.filter(month=f"{value}-01")
