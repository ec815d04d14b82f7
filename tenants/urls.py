"""API routes of tenants, members, quota and the audit log."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from tenants import api

router = SimpleRouter()
router.register("tenants", api.TenantViewSet, basename="tenant")
router.register("quota-requests", api.QuotaRequestViewSet, basename="quota-request")
router.register("quotas", api.QuotaViewSet, basename="quota")
router.register("audit", api.AuditViewSet, basename="audit")

members = api.MemberViewSet.as_view({"get": "list", "post": "create"})
member = api.MemberViewSet.as_view({"patch": "partial_update", "delete": "destroy"})

api_urlpatterns = [
    path("me/", api.Me.as_view(), name="me"),
    path("tenants/<slug:tenant_slug>/members/", members, name="tenant-members"),
    path("tenants/<slug:tenant_slug>/members/<str:username>/", member, name="tenant-member"),
    *router.urls,
]
