"""The list filters of the reports' API."""

import django_filters
from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field

from reports.models import Statement

# --- Statements

MONTH = r"^2[0-9]{3}-(0[1-9]|1[0-2])$"  # the years 2000–2999
MONTH_FILTER = RegexValidator(MONTH, "A month as YYYY-MM.")


@extend_schema_field({"type": "string", "pattern": MONTH})
class MonthFilter(django_filters.CharFilter):
    """A month as YYYY-MM: the schema says what the filter accepts."""


class StatementFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant_slug", max_length=63)
    month = MonthFilter(method="filter_month", max_length=7, validators=[MONTH_FILTER])

    class Meta:
        model = Statement
        fields = ["tenant", "month"]

    def filter_month(self, queryset, name, value):
        return queryset.filter(month=f"{value}-01")
