"""Jobs, their events and logs, templates and usage (API.md, Jobs)."""

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.backends.base import BackendUnavailable, JobRef
from clusters.services import backend_of
from jobs import services
from jobs.filters import JobFilter
from jobs.job_templates import TEMPLATES
from jobs.models import Job
from jobs.selectors import jobs_visible_to, usage_of
from jobs.serializers import (
    JobDetailOut,
    JobEventOut,
    JobIn,
    JobOut,
    LogIn,
    LogOut,
    TemplateOut,
    TemplatePageOut,
    UsageIn,
    UsageOut,
)
from portal.core.errors import Forbidden, Unavailable
from tenants import roles
from tenants.api import parsed, require
from tenants.selectors import tenant_perms

IDEMPOTENCY_KEY_MAX = 128


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Job.objects.none()
    filterset_class = JobFilter

    def get_queryset(self):
        return jobs_visible_to(user=self.request.user)

    def get_serializer_class(self):
        return JobDetailOut if self.action == "retrieve" else JobOut

    @extend_schema(
        request=JobIn,
        responses={201: JobOut, 200: JobOut},
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER)],
    )
    def create(self, request):
        """Submit a job. A repeat with the same Idempotency-Key answers 200 with the first job."""
        key = request.headers.get("Idempotency-Key", "")
        if len(key) > IDEMPOTENCY_KEY_MAX:
            raise ValidationError({"Idempotency-Key": [f"At most {IDEMPOTENCY_KEY_MAX} characters."]})
        data = parsed(JobIn, request)
        require(request.user, data["tenant"], roles.SUBMIT_JOB)
        job, created = services.job_submit(
            user=request.user,
            request=services.JobRequest(**data),
            idempotency_key=key,
            digest=services.request_digest(request.data) if key else "",
        )
        job = self.get_queryset().get(pk=job.pk)
        return Response(JobOut(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={202: JobOut})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        perms = tenant_perms(user=request.user, tenant=job.tenant)
        own = job.submitted_by_id == request.user.id and roles.SUBMIT_JOB in perms
        if not own and roles.CANCEL_ANY_JOB not in perms:
            raise Forbidden("Your role allows cancelling only your own jobs.")
        services.job_cancel(actor=request.user, job=job)
        return Response(JobOut(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=JobEventOut(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        job = self.get_object()
        return Response(JobEventOut(job.events.all(), many=True).data)

    @extend_schema(parameters=[LogIn], responses=LogOut)
    @action(detail=True, methods=["get"])
    def log(self, request, pk=None):
        """The last `tail` lines (≤ 5000) of the job's output."""
        job = self.get_object()
        query = LogIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        if not job.backend_id:
            return Response({"lines": [], "truncated": False})
        try:
            tail = backend_of(job.cluster).log_tail(
                JobRef(backend_id=job.backend_id, token=job.token, account=job.tenant.slug),
                lines=query.validated_data["tail"],
                max_bytes=settings.JOB_LOG_MAX_BYTES,
            )
        except BackendUnavailable:
            raise Unavailable(f"Cluster {job.cluster.slug} does not answer; try again shortly.") from None
        return Response(LogOut({"lines": tail.lines, "truncated": tail.truncated}).data)


class TemplateList(APIView):
    """Job templates per scenario, each with the JSON Schema of its parameters."""

    @extend_schema(parameters=[OpenApiParameter("scenario", OpenApiTypes.STR)], responses=TemplatePageOut)
    def get(self, request):
        rows = [
            {
                "slug": t.slug,
                "scenario": t.scenario,
                "name": t.name,
                "description": t.description,
                "parameters_schema": t.parameters_schema,
            }
            for t in TEMPLATES.values()
            if t.scenario == request.query_params.get("scenario", t.scenario)
        ]
        return Response({"next": None, "previous": None, "results": TemplateOut(rows, many=True).data})


class Usage(APIView):
    """GPU-hours of finished jobs by day, user or GPU model, over a date range."""

    @extend_schema(parameters=[UsageIn], responses=UsageOut)
    def get(self, request):
        query = UsageIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        rows = usage_of(
            user=request.user,
            tenant_slug=data["tenant"],
            start=data["from"],
            end=data["to"],
            group_by=data["group_by"],
        )
        return Response({"results": rows})
