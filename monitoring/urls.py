"""API routes of alerts and a tenant's alert channels."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from monitoring import api

router = SimpleRouter()
router.register("alerts", api.AlertViewSet, basename="alert")

channels = api.AlertChannelViewSet.as_view({"get": "list", "post": "create"})
channel = api.AlertChannelViewSet.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"})

api_urlpatterns = [
    path("tenants/<slug:tenant_slug>/alert-channels/", channels, name="tenant-alert-channels"),
    path("tenants/<slug:tenant_slug>/alert-channels/<int:pk>/", channel, name="tenant-alert-channel"),
    *router.urls,
]
