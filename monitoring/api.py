"""Alerts, a tenant's alert channels, and the Alertmanager receiver (docs/api.md, Additions:
monitoring). Views parse, check the caller's role, and call one selector or service."""

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from monitoring import services
from monitoring.filters import AlertFilter
from monitoring.models import Alert, AlertChannel
from monitoring.selectors import alerts_visible_to, channels_of
from monitoring.serializers import (
    AlertChannelIn,
    AlertChannelOut,
    AlertChannelPatch,
    AlertDetailOut,
    AlertmanagerMessageIn,
    AlertOut,
)
from monitoring.views import bearer_matches
from portal.core.parsing import parsed
from portal.core.serializers import ID_LOOKUP
from tenants.viewsets import KeptByManagers


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Alerts of the caller's tenants, newest first; a platform alert to staff only."""

    queryset = Alert.objects.none()
    serializer_class = AlertOut
    filterset_class = AlertFilter
    lookup_value_regex = ID_LOOKUP

    def get_queryset(self):
        alerts = alerts_visible_to(user=self.request.user)
        if self.action == "retrieve":
            return alerts.prefetch_related("deliveries__channel")
        return alerts

    @extend_schema(responses=AlertDetailOut)
    def retrieve(self, request, pk=None):
        return Response(AlertDetailOut(self.get_object()).data)


class AlertChannelViewSet(KeptByManagers):
    """A tenant's chat robots and webhooks: its owners and managers keep them."""

    queryset = AlertChannel.objects.none()
    serializer_class = AlertChannelOut

    def get_queryset(self):
        return channels_of(tenant=self.tenant())

    def list(self, request, tenant_slug=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(AlertChannelOut(page, many=True).data)

    @extend_schema(request=AlertChannelIn, responses={201: AlertChannelOut})
    def create(self, request, tenant_slug=None):
        tenant = self.tenant()  # 404, then 403, before the body is read
        data = parsed(AlertChannelIn, request)
        channel = services.alert_channel_create(actor=request.user, tenant=tenant, **data)
        return Response(AlertChannelOut(channel).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request, tenant_slug=None, pk=None):
        return Response(AlertChannelOut(self.one(pk)).data)

    @extend_schema(request=AlertChannelPatch, responses=AlertChannelOut)
    def partial_update(self, request, tenant_slug=None, pk=None):
        channel = self.one(pk)
        serializer = AlertChannelPatch(channel, data=request.data, partial=True, context={"request": request})
        serializer.is_valid(raise_exception=True)
        channel = services.alert_channel_change(
            actor=request.user, channel=channel, **serializer.validated_data
        )
        return Response(AlertChannelOut(channel).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, tenant_slug=None, pk=None):
        services.alert_channel_delete(actor=request.user, channel=self.one(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(exclude=True)  # Alertmanager's, not a client's (docs/api.md, Additions: service)
class AlertmanagerReceiver(APIView):
    """POST /hooks/alertmanager: Alertmanager's webhook, with `Authorization: Bearer
    <ALERTMANAGER_TOKEN>`; 404 while none is set."""

    authentication_classes = []
    permission_classes = []
    throttle_classes = []

    def post(self, request):
        if not settings.ALERTMANAGER_TOKEN:
            raise Http404
        if not bearer_matches(request, settings.ALERTMANAGER_TOKEN):
            raise exceptions.NotAuthenticated("Alertmanager's bearer token is needed.")
        data = parsed(AlertmanagerMessageIn, request)
        incoming = [
            services.IncomingAlert(
                fingerprint=item["fingerprint"],
                status=item["status"],
                labels=item["labels"],
                annotations=item["annotations"],
                starts_at=item["startsAt"],
                ends_at=item["endsAt"],
            )
            for item in data["alerts"]
        ]
        report = services.alerts_receive(incoming)
        return Response(
            {
                "new": len(report.new),
                "repeated": len(report.repeated),
                "resolved": len(report.resolved),
                "deliveries": len(report.deliveries),
            }
        )

    def get_authenticate_header(self, request):
        return 'Bearer realm="alertmanager"'
