"""API routes of tenants, members, quota, the audit log and cohorts."""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from portal.core.serializers import SLUG_LOOKUP
from tenants import api

router = SimpleRouter()
router.register("tenants", api.TenantViewSet, basename="tenant")
router.register("quota-requests", api.QuotaRequestViewSet, basename="quota-request")
router.register("quotas", api.QuotaViewSet, basename="quota")
router.register("audit", api.AuditViewSet, basename="audit")
router.register("cohorts", api.CohortViewSet, basename="cohort")

members = api.MemberViewSet.as_view({"get": "list", "post": "create"})
member = api.MemberViewSet.as_view({"patch": "partial_update", "delete": "destroy"})
cohort_member = api.CohortMemberViewSet.as_view({"put": "update", "delete": "destroy"})

api_urlpatterns = [
    path("me/", api.Me.as_view(), name="me"),
    path("tenants/<slug:tenant_slug>/members/", members, name="tenant-members"),
    path("tenants/<slug:tenant_slug>/members/<str:username>/", member, name="tenant-member"),
    re_path(
        rf"^cohorts/(?P<slug>{SLUG_LOOKUP})/members/(?P<tenant_slug>{SLUG_LOOKUP})/$",
        cohort_member,
        name="cohort-member",
    ),
    *router.urls,
]
