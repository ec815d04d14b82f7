"""API routes of a tenant's webhooks and of the caller's notifications."""

from django.urls import path, re_path

from portal.core.serializers import ID_LOOKUP, SLUG_LOOKUP
from webhooks import api

endpoints = api.EndpointViewSet.as_view({"get": "list", "post": "create"})
endpoint = api.EndpointViewSet.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"})
ping = api.EndpointViewSet.as_view({"post": "ping"})
deliveries = api.DeliveryViewSet.as_view({"get": "list"})
redeliver = api.DeliveryViewSet.as_view({"post": "redeliver"})
TENANT = rf"^tenants/(?P<tenant_slug>{SLUG_LOOKUP})/webhooks/"

api_urlpatterns = [
    path("me/notifications/", api.Notifications.as_view(), name="me-notifications"),
    re_path(TENANT + r"$", endpoints, name="tenant-webhooks"),
    re_path(TENANT + rf"(?P<pk>{ID_LOOKUP})/$", endpoint, name="tenant-webhook"),
    re_path(TENANT + rf"(?P<pk>{ID_LOOKUP})/ping/$", ping, name="tenant-webhook-ping"),
    re_path(
        TENANT + rf"(?P<endpoint_pk>{ID_LOOKUP})/deliveries/$", deliveries, name="tenant-webhook-deliveries"
    ),
    re_path(
        TENANT + rf"(?P<endpoint_pk>{ID_LOOKUP})/deliveries/(?P<pk>{ID_LOOKUP})/redeliver/$",
        redeliver,
        name="tenant-webhook-redeliver",
    ),
]
