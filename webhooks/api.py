"""A tenant's webhook endpoints, their delivery log and redelivery, and the caller's job-end mail
(docs/api.md, Webhooks). Views parse, check the caller's role, and call one selector or service."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.parsing import parsed
from tenants.viewsets import KeptByManagers
from webhooks import services
from webhooks.models import Endpoint
from webhooks.selectors import deliveries_of, endpoints_of, job_end_mail_of
from webhooks.serializers import (
    NotificationsIO,
    WebhookDeliveryOut,
    WebhookEndpointCreatedOut,
    WebhookEndpointIn,
    WebhookEndpointOut,
    WebhookEndpointPatch,
)


class _TenantWebhooks(KeptByManagers):
    """A tenant's endpoints: its owners and managers keep them (another tenant's: 404 first)."""

    queryset = Endpoint.objects.none()

    def get_queryset(self):
        return endpoints_of(tenant=self.tenant())


class EndpointViewSet(_TenantWebhooks):
    serializer_class = WebhookEndpointOut

    def list(self, request, tenant_slug=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WebhookEndpointOut(page, many=True).data)

    @extend_schema(request=WebhookEndpointIn, responses={201: WebhookEndpointCreatedOut})
    def create(self, request, tenant_slug=None):
        tenant = self.tenant()  # 404, then 403, before the body is read
        data = parsed(WebhookEndpointIn, request)
        endpoint, secret = services.endpoint_create(actor=request.user, tenant=tenant, **data)
        return Response(
            {**WebhookEndpointOut(endpoint).data, "secret": secret}, status=status.HTTP_201_CREATED
        )

    def retrieve(self, request, tenant_slug=None, pk=None):
        return Response(WebhookEndpointOut(self.one(pk)).data)

    @extend_schema(request=WebhookEndpointPatch, responses={200: WebhookEndpointOut})
    def partial_update(self, request, tenant_slug=None, pk=None):
        endpoint = self.one(pk)
        data = parsed(WebhookEndpointPatch, request)
        endpoint, secret = services.endpoint_change(actor=request.user, endpoint=endpoint, **data)
        answer = WebhookEndpointOut(endpoint).data
        return Response({**answer, "secret": secret} if secret else answer)

    @extend_schema(responses={204: None})
    def destroy(self, request, tenant_slug=None, pk=None):
        services.endpoint_delete(actor=request.user, endpoint=self.one(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: WebhookDeliveryOut})
    def ping(self, request, tenant_slug=None, pk=None):
        delivery = services.ping(actor=request.user, endpoint=self.one(pk))
        return Response(WebhookDeliveryOut(delivery).data, status=status.HTTP_202_ACCEPTED)


class DeliveryViewSet(_TenantWebhooks):
    serializer_class = WebhookDeliveryOut

    def deliveries(self, endpoint_pk: str):
        return deliveries_of(endpoint=self.one(endpoint_pk))

    def list(self, request, tenant_slug=None, endpoint_pk=None):
        page = self.paginate_queryset(self.deliveries(endpoint_pk))
        return self.get_paginated_response(WebhookDeliveryOut(page, many=True).data)

    @extend_schema(request=None, responses={202: WebhookDeliveryOut})
    def redeliver(self, request, tenant_slug=None, endpoint_pk=None, pk=None):
        delivery = get_object_or_404(self.deliveries(endpoint_pk), pk=int(pk))
        again = services.redeliver(actor=request.user, delivery=delivery)
        return Response(WebhookDeliveryOut(again).data, status=status.HTTP_202_ACCEPTED)


class Notifications(APIView):
    """The caller's own notifications: a mail when each of their jobs ends (off by default)."""

    @extend_schema(responses=NotificationsIO)
    def get(self, request):
        return Response({"job_end_mail": job_end_mail_of(request.user)})

    @extend_schema(request=NotificationsIO, responses=NotificationsIO)
    def put(self, request):
        data = parsed(NotificationsIO, request)
        choice = services.job_end_mail_set(user=request.user, enabled=data["job_end_mail"])
        return Response({"job_end_mail": choice.enabled})
