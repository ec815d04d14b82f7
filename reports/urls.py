"""API routes of statements, the site report and the TCO view; the pages' routes are in
`pages` (portal/urls.py includes both)."""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from portal.core.serializers import SLUG_LOOKUP
from reports import api, views

# A statement's page: by its month (YYYY-MM) or its id.
STATEMENT_KEY = r"2[0-9]{3}-(?:0[1-9]|1[0-2])|[0-9]{1,18}"
# Statements: list, make, read, and the PDF, CSV and XLSX actions (with their renderers).
statement_routes = SimpleRouter()
statement_routes.register("statements", api.StatementViewSet, basename="statement")

api_urlpatterns = [
    # --- Statements
    *statement_routes.urls,
    # --- Site report
    path("reports/site/", api.SiteReportView.as_view(), name="site-report-api"),
    path("reports/site/csv/", api.SiteReportCsv.as_view(), name="site-report-csv"),
    path("reports/site/xlsx/", api.SiteReportXlsx.as_view(), name="site-report-xlsx"),
    # --- TCO
    re_path(r"^tco/$", api.TcoViewSet.as_view({"get": "list", "post": "create"}), name="tco-list"),
    re_path(
        r"^tco/(?P<pk>[0-9]{1,18})/$",
        api.TcoViewSet.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"}),
        name="tco-detail",
    ),
]

pages = [
    # --- Statements
    re_path(rf"^t/(?P<slug>{SLUG_LOOKUP})/statements/$", views.statements, name="statements"),
    re_path(
        rf"^t/(?P<slug>{SLUG_LOOKUP})/statements/(?P<key>{STATEMENT_KEY})/$",
        views.statement,
        name="statement",
    ),
    # --- Site report
    path("reports/site/", views.site_report, name="site-report"),
    # --- TCO
    path("reports/tco/", views.tco_view, name="tco"),
    path("reports/tco/example/", views.tco_example, name="tco-example"),
    re_path(r"^reports/tco/(?P<profile_id>[0-9]{1,18})/$", views.tco_save, name="tco-save"),
    re_path(r"^reports/tco/(?P<profile_id>[0-9]{1,18})/delete/$", views.tco_delete, name="tco-delete"),
]
