"""Tenants, members, quota requests, grants and the audit log (docs/api.md). Views parse, check the
caller's role through tenant_perms(), and call one selector or service."""

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.conditional import ConditionalGet
from portal.core.models import AuditEvent
from portal.core.pagination import CursorPage
from portal.core.parsing import parsed
from portal.core.serializers import ID_LOOKUP, SLUG_LOOKUP, SLUG_PATTERN, USERNAME_PATTERN, is_username
from portal.core.staff import is_platform_admin, staff_roles_of
from tenants import cohorts, roles, services
from tenants.cohorts import cohorts_visible_to
from tenants.filters import AuditFilter, QuotaFilter, QuotaRequestFilter
from tenants.models import Cohort, CohortMember, Membership, QuotaGrant, QuotaRequest, Role, Tenant
from tenants.permissions import member_candidate, require, require_platform_admin, require_quota_decider
from tenants.selectors import (
    audit_visible_to,
    grants_visible_to,
    members_of,
    membership_rows_of,
    quota_requests_visible_to,
    tenants_visible_to,
)
from tenants.serializers import (
    ApprovalIn,
    AuditOut,
    CohortIn,
    CohortMemberIn,
    CohortMemberOut,
    CohortOut,
    CohortPatch,
    DecisionIn,
    MemberIn,
    MemberOut,
    MemberPatch,
    MeOut,
    QuotaOut,
    QuotaRequestIn,
    QuotaRequestOut,
    TenantIn,
    TenantOut,
    TenantPatch,
)


class Me(APIView):
    """Who the caller is, and the tenants they belong to with their role in each."""

    @extend_schema(responses=MeOut)
    def get(self, request):
        # MeOut's fields built as they are shown (strings, booleans, rows of strings): MeOut is the
        # schema, and its walk over them only copied what is here (a fifth of the answer's cost).
        # tests/tenants: the answer equals MeOut's.
        user = request.user
        me = {
            "username": user.get_username(),
            "email": user.email or "",
            "is_staff": bool(user.is_staff),
            "platform_admin": is_platform_admin(user),
            "staff_roles": staff_roles_of(user),
            "tenants": membership_rows_of(user=user),
        }
        return Response(me)


class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = TenantOut
    queryset = Tenant.objects.none()
    lookup_field = "slug"
    lookup_value_regex = SLUG_LOOKUP

    def get_queryset(self):
        return tenants_visible_to(user=self.request.user)

    @extend_schema(request=TenantIn, responses={201: TenantOut})
    def create(self, request):
        require_platform_admin(request.user)
        data = parsed(TenantIn, request)
        tenant = services.tenant_create(actor=request.user, **data)
        return Response(TenantOut(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TenantPatch, responses=TenantOut)
    def partial_update(self, request, slug=None):
        tenant = self.get_object()
        changes = parsed(TenantPatch, request)
        if changes.keys() & {"tier", "state"}:
            require_platform_admin(request.user)
        if changes.keys() & {"name", "contact_email"}:
            require(request.user, tenant, roles.CHANGE)
        tenant = services.tenant_update(actor=request.user, tenant=tenant, changes=changes)
        return Response(TenantOut(tenant).data)


TENANT_SLUG = OpenApiParameter("tenant_slug", str, OpenApiParameter.PATH, pattern=SLUG_PATTERN)
USERNAME = OpenApiParameter("username", str, OpenApiParameter.PATH, pattern=USERNAME_PATTERN)


@extend_schema_view(
    list=extend_schema(parameters=[TENANT_SLUG]),
    create=extend_schema(parameters=[TENANT_SLUG]),
    partial_update=extend_schema(parameters=[TENANT_SLUG, USERNAME]),
    destroy=extend_schema(parameters=[TENANT_SLUG, USERNAME]),
)
class MemberViewSet(viewsets.GenericViewSet):
    """Members of one tenant. Managers manage members; only owners make or unmake owners."""

    serializer_class = MemberOut
    queryset = Membership.objects.none()
    lookup_field = "username"

    def tenant(self) -> Tenant:
        if not hasattr(self, "_tenant"):
            self._tenant = get_object_or_404(
                tenants_visible_to(user=self.request.user), slug=self.kwargs["tenant_slug"]
            )
        return self._tenant

    def get_queryset(self):
        return members_of(tenant=self.tenant())

    def member(self, username: str) -> Membership:
        # The URL takes any text here; one that is no username is no member, and is not sent to
        # PostgreSQL, which refuses a NUL byte with an error.
        if not is_username(username):
            raise Http404("No such member.")
        return get_object_or_404(self.get_queryset(), user__username=username)

    def _require_manage(self, *touched_roles: str) -> None:
        tenant = self.tenant()
        require(self.request.user, tenant, roles.MANAGE_MEMBERS)
        if Role.OWNER in touched_roles:
            require(self.request.user, tenant, roles.CHANGE)  # owners (and admins) only

    def list(self, request, tenant_slug=None):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(MemberOut(page, many=True).data)

    @extend_schema(request=MemberIn, responses={201: MemberOut})
    def create(self, request, tenant_slug=None):
        # 404 for a tenant the caller cannot see, then 403 for a role that may not add, before the
        # body is read: neither an outsider nor a viewer learns anything from what they send.
        tenant = self.tenant()
        require(request.user, tenant, roles.MANAGE_MEMBERS)
        data = parsed(MemberIn, request)
        self._require_manage(data["role"])
        user = member_candidate(request.user, data["username"])
        membership = services.membership_add(actor=request.user, tenant=tenant, user=user, role=data["role"])
        return Response(MemberOut(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MemberPatch, responses=MemberOut)
    def partial_update(self, request, tenant_slug=None, username=None):
        membership = self.member(username)
        require(request.user, self.tenant(), roles.MANAGE_MEMBERS)
        data = parsed(MemberPatch, request)
        self._require_manage(membership.role, data["role"])
        membership = services.membership_change_role(
            actor=request.user, membership=membership, role=data["role"]
        )
        return Response(MemberOut(membership).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, tenant_slug=None, username=None):
        membership = self.member(username)
        if membership.user_id != request.user.id:  # anyone may leave; removing others takes the role
            self._require_manage(membership.role)
        services.membership_remove(actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class QuotaRequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = QuotaRequestOut
    queryset = QuotaRequest.objects.none()
    filterset_class = QuotaRequestFilter
    lookup_value_regex = ID_LOOKUP

    def get_queryset(self):
        return quota_requests_visible_to(user=self.request.user)

    @extend_schema(request=QuotaRequestIn, responses={201: QuotaRequestOut})
    def create(self, request):
        data = parsed(QuotaRequestIn, request)
        require(request.user, data["tenant"], roles.REQUEST_QUOTA)
        quota_request = services.quota_request_create(actor=request.user, **data)
        return Response(QuotaRequestOut(quota_request).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        """Withdraw a pending request; it stays listed as withdrawn."""
        quota_request = self.get_object()
        require(request.user, quota_request.tenant, roles.REQUEST_QUOTA)
        services.quota_request_withdraw(actor=request.user, request=quota_request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=ApprovalIn, responses=QuotaRequestOut)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        quota_request = self.get_object()
        require_quota_decider(request.user)
        data = parsed(ApprovalIn, request)
        quota_request = services.quota_request_approve(actor=request.user, request=quota_request, **data)
        return Response(QuotaRequestOut(quota_request).data)

    @extend_schema(request=DecisionIn, responses=QuotaRequestOut)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        quota_request = self.get_object()
        require_quota_decider(request.user)
        data = parsed(DecisionIn, request)
        quota_request = services.quota_request_reject(actor=request.user, request=quota_request, **data)
        return Response(QuotaRequestOut(quota_request).data)


class QuotaViewSet(ConditionalGet, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = QuotaOut
    queryset = QuotaGrant.objects.none()
    filterset_class = QuotaFilter
    lookup_value_regex = ID_LOOKUP

    def get_queryset(self):
        return grants_visible_to(user=self.request.user)


class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = AuditOut
    queryset = AuditEvent.objects.none()
    filterset_class = AuditFilter

    def get_queryset(self):
        return audit_visible_to(user=self.request.user)


# --- Cohorts (docs/api.md, Lending between tenants)


class CohortPage(CursorPage):
    ordering = "slug"
    position_pattern = SLUG_LOOKUP


class CohortViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Cohorts of tenants that lend each other idle GPUs. Platform admins write; staff who see
    every tenant read them all; anyone else reads the cohorts of their tenants, with only their
    own tenants' member rows."""

    serializer_class = CohortOut
    queryset = Cohort.objects.none()
    pagination_class = CohortPage
    lookup_field = "slug"
    lookup_value_regex = SLUG_LOOKUP

    def get_queryset(self):
        return cohorts_visible_to(user=self.request.user)

    @extend_schema(request=CohortIn, responses={201: CohortOut})
    def create(self, request):
        require_platform_admin(request.user)
        data = parsed(CohortIn, request)
        cohort = cohorts.cohort_create(actor=request.user, **data)
        return Response(CohortOut(self.get_queryset().get(pk=cohort.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=CohortPatch, responses=CohortOut)
    def partial_update(self, request, slug=None):
        cohort = self.get_object()  # 404 for a cohort the caller cannot see, then 403, then the body
        require_platform_admin(request.user)
        changes = parsed(CohortPatch, request)
        cohort = cohorts.cohort_update(actor=request.user, cohort=cohort, changes=changes)
        return Response(CohortOut(self.get_queryset().get(pk=cohort.pk)).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, slug=None):
        cohort = self.get_object()
        require_platform_admin(request.user)
        cohorts.cohort_delete(actor=request.user, cohort=cohort)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CohortMemberViewSet(viewsets.GenericViewSet):
    """A tenant's place in a cohort, set and removed by platform admins."""

    serializer_class = CohortMemberOut
    queryset = CohortMember.objects.none()
    lookup_field = "tenant__slug"
    lookup_url_kwarg = "tenant_slug"

    def get_queryset(self):
        # The caller's right to the cohort is cohort()'s, asked first by each action.
        return CohortMember.objects.filter(cohort__slug=self.kwargs["slug"]).select_related(
            "cohort", "tenant"
        )

    def cohort(self) -> Cohort:
        # 404 for a cohort the caller cannot see, then 403 for anyone but a platform admin, before
        # the tenant or the body is read.
        cohort = get_object_or_404(cohorts_visible_to(user=self.request.user), slug=self.kwargs["slug"])
        require_platform_admin(self.request.user)
        return cohort

    @extend_schema(request=CohortMemberIn, responses={200: CohortMemberOut, 201: CohortMemberOut})
    def update(self, request, slug=None, tenant_slug=None):
        """Make the tenant a member with these limits (201), or change its limits (200)."""
        cohort = self.cohort()
        tenant = get_object_or_404(Tenant, slug=tenant_slug)
        data = parsed(CohortMemberIn, request)
        member, created = cohorts.cohort_member_set(actor=request.user, cohort=cohort, tenant=tenant, **data)
        return Response(
            CohortMemberOut(member).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(responses={204: None})
    def destroy(self, request, slug=None, tenant_slug=None):
        self.cohort()
        cohorts.cohort_member_remove(actor=request.user, member=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
