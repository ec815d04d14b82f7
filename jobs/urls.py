"""API routes of jobs, templates, usage, a tenant's lending and its budgets."""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from jobs import api
from portal.core.serializers import ID_LOOKUP, SLUG_LOOKUP

router = SimpleRouter()
router.register("jobs", api.JobViewSet, basename="job")
lending = api.TenantLendingViewSet.as_view({"get": "retrieve"})
loans = api.TenantLoanViewSet.as_view({"get": "list"})
budgets = api.TenantBudgetViewSet.as_view({"get": "overview", "post": "create"})
budget = api.TenantBudgetViewSet.as_view({"patch": "partial_update", "delete": "destroy"})
TENANT = rf"^tenants/(?P<tenant_slug>{SLUG_LOOKUP})/"

api_urlpatterns = [
    path("templates/", api.TemplateList.as_view(), name="templates"),
    path("usage/", api.Usage.as_view(), name="usage"),
    path("events/stream/", api.EventStream.as_view(), name="event-stream"),
    re_path(rf"^jobs/(?P<pk>{ID_LOOKUP})/log/stream/$", api.JobLogStream.as_view(), name="job-log-stream"),
    re_path(TENANT + r"lending/$", lending, name="tenant-lending"),
    re_path(TENANT + r"loans/$", loans, name="tenant-loans"),
    re_path(TENANT + r"budgets/$", budgets, name="tenant-budgets"),
    re_path(TENANT + rf"budgets/(?P<pk>{ID_LOOKUP})/$", budget, name="tenant-budget"),
    *router.urls,
]
