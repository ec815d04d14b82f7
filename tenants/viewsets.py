"""The bases of the API's views of a tenant's own objects at /tenants/{tenant_slug}/…/: those its
owners and managers keep (alert channels, webhooks): the tenant is looked up once per request,
404 for one the caller cannot see and 403 for a role without MANAGE_MEMBERS, before a body or an
object id is read; and what every member reads (ReadByMembers: lending, loans)."""

from django.shortcuts import get_object_or_404
from rest_framework import viewsets

from portal.core.serializers import ID_LOOKUP
from tenants import roles
from tenants.models import Tenant
from tenants.permissions import require
from tenants.selectors import tenants_visible_to


class KeptByManagers(viewsets.GenericViewSet):
    lookup_value_regex = ID_LOOKUP
    schema_forbids_reads = True  # a viewer or member of the tenant: 403

    def tenant(self) -> Tenant:
        if not hasattr(self, "_tenant"):
            user = self.request.user
            self._tenant = get_object_or_404(tenants_visible_to(user=user), slug=self.kwargs["tenant_slug"])
            require(user, self._tenant, roles.MANAGE_MEMBERS)
        return self._tenant

    def one(self, pk: str):
        """The tenant's object with this id (get_queryset's), or 404."""
        return get_object_or_404(self.get_queryset(), pk=int(pk))


class ReadByMembers(viewsets.GenericViewSet):
    """The base of the API's views of what every member of a tenant reads at
    /tenants/{tenant_slug}/…/ (its lending and loans): the tenant is looked up once per request,
    404 for one the caller cannot see, before a query parameter is read. Any role of the tenant
    reads, and so do staff who see every tenant."""

    def tenant(self) -> Tenant:
        if not hasattr(self, "_tenant"):
            user = self.request.user
            self._tenant = get_object_or_404(tenants_visible_to(user=user), slug=self.kwargs["tenant_slug"])
        return self._tenant
