"""The group mapping API: platform admins map directory groups to tenant roles; staff who see
every tenant read the mappings; anyone else gets 403 (docs/api.md, Group mappings)."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response

from identity import services
from identity.models import GroupMapping
from identity.selectors import group_mappings_visible_to
from identity.serializers import GroupMappingIn, GroupMappingOut, GroupMappingPatch
from portal.core.parsing import parsed
from portal.core.serializers import ID_LOOKUP
from tenants.permissions import require_platform_admin, require_staff_reader


class GroupMappingViewSet(viewsets.GenericViewSet):
    queryset = GroupMapping.objects.none()
    serializer_class = GroupMappingOut
    lookup_value_regex = ID_LOOKUP
    filterset_fields = ["source"]
    schema_forbids_reads = True  # 403 for anyone but staff who see every tenant

    def get_queryset(self):
        require_staff_reader(self.request.user)
        mappings = group_mappings_visible_to(user=self.request.user)
        tenant = self.request.query_params.get("tenant")
        return mappings.filter(tenant__slug=tenant) if tenant else mappings

    def list(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(GroupMappingOut(page, many=True).data)

    def retrieve(self, request, pk=None):
        return Response(GroupMappingOut(get_object_or_404(self.get_queryset(), pk=int(pk))).data)

    @extend_schema(request=GroupMappingIn, responses={201: GroupMappingOut})
    def create(self, request):
        require_platform_admin(request.user)
        mapping = services.group_mapping_create(actor=request.user, **parsed(GroupMappingIn, request))
        return Response(GroupMappingOut(mapping).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=GroupMappingPatch, responses=GroupMappingOut)
    def partial_update(self, request, pk=None):
        mapping = get_object_or_404(self.get_queryset(), pk=int(pk))
        require_platform_admin(request.user)
        data = parsed(GroupMappingPatch, request)
        return Response(
            GroupMappingOut(services.group_mapping_change(actor=request.user, mapping=mapping, **data)).data
        )

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        mapping = get_object_or_404(self.get_queryset(), pk=int(pk))
        require_platform_admin(request.user)
        services.group_mapping_delete(actor=request.user, mapping=mapping)
        return Response(status=status.HTTP_204_NO_CONTENT)
