"""Jobs, their events and logs, templates and usage (docs/api.md, Jobs)."""

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import money
from billing.budgets import budget_change, budget_create, budget_delete
from billing.models import Budget
from clusters.selectors import catalog_names
from clusters.shares import Share
from jobs import services, stream
from jobs.budgets import budget_of, budget_status, budgets_of
from jobs.filters import JobFilter, LoanFilter
from jobs.job_templates import TEMPLATES
from jobs.models import Job, Loan
from jobs.selectors import (
    gpu_samples_of,
    job_answer_row_visible_to,
    job_answer_rows_visible_to,
    job_answers_visible_to,
    jobs_visible_to,
    lending_of,
    loans_of,
    usage_of,
)
from jobs.serializers import (
    BudgetIn,
    BudgetOut,
    BudgetPageOut,
    BudgetPatch,
    JobDetailOut,
    JobEventOut,
    JobGpuSampleOut,
    JobIn,
    JobOut,
    LendingIn,
    LendingOut,
    LoanOut,
    LogIn,
    LogOut,
    TemplateOut,
    TemplatePageOut,
    UsageIn,
    UsageOut,
    job_answer,
)
from portal.core.conditional import ConditionalGet
from portal.core.parsing import parsed
from portal.core.renderers import JSONRenderer
from portal.core.serializers import ID_LOOKUP
from tenants import roles
from tenants.permissions import require
from tenants.viewsets import ReadByMembers


class JobViewSet(ConditionalGet, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Job.objects.none()
    serializer_class = JobOut
    filterset_class = JobFilter
    lookup_value_regex = ID_LOOKUP

    def get_queryset(self):
        if self.action in ("events", "log"):  # these read the job's cluster, token and events
            return jobs_visible_to(user=self.request.user)
        if self.action == "list":
            return job_answer_rows_visible_to(user=self.request.user)
        return job_answers_visible_to(user=self.request.user)

    def filter_queryset(self, queryset):
        # The list's filters are the list's: on one job they would only build a FilterSet's form.
        return super().filter_queryset(queryset) if self.action == "list" else queryset

    @extend_schema(responses=JobDetailOut)
    def retrieve(self, request, pk=None):
        """The job; its script and environment only for its submitter, owners and managers, since
        an environment often carries a credential the tenant's viewers should not read."""
        found = job_answer_row_visible_to(user=request.user, pk=int(pk))
        if found is None:
            raise NotFound
        row, detailed = found
        # The answer straight from the row (JobOut's own to_representation, without DRF's
        # serializer instance and its ReturnDict around it).
        answer = job_answer(row, catalog_names([row]), timezone.get_current_timezone(),
                            JobDetailOut if detailed else JobOut)  # fmt: skip
        return Response(answer)

    @extend_schema(
        request=JobIn,
        responses={201: JobOut, 200: JobOut},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                {"type": "string", "maxLength": services.IDEMPOTENCY_KEY_MAX},
                OpenApiParameter.HEADER,
            )
        ],
    )
    def create(self, request):
        """Submit a job. A repeat with the same Idempotency-Key answers 200 with the first job."""
        data = parsed(JobIn, request)
        require(request.user, data["tenant"], roles.SUBMIT_JOB)
        share = Share(
            data.pop("share"), data.pop("mig_profile"), data.pop("gpu_memory_mib"), data.pop("gpu_cores_pct")
        )
        codes = tuple(data.pop("restart_exit_codes"))
        job, created = services.job_submit(
            user=request.user,
            request=services.JobRequest(**data, share=share, restart_exit_codes=codes),
            idempotency_key=request.headers.get("Idempotency-Key", ""),
            body=request.data,
        )
        return Response(JobOut(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={202: JobOut})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        services.job_cancel(actor=request.user, job=job)
        return Response(JobOut(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=JobEventOut(many=True))
    # No filter_backends on these two: the job list's filters are not theirs to take.
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def events(self, request, pk=None):
        job = self.get_object()
        return Response(JobEventOut(job.events.all(), many=True).data)

    @extend_schema(responses=JobGpuSampleOut(many=True))
    @action(detail=True, methods=["get"], url_path="gpu-samples", pagination_class=None, filter_backends=[])
    def gpu_samples(self, request, pk=None):
        """The job's GPU readings over its life, oldest first (at most 720: every k-th when it
        has more, the latest always kept); [] before its first reading."""
        job = self.get_object()
        return Response(JobGpuSampleOut(gpu_samples_of(job), many=True).data)

    @extend_schema(
        parameters=[LogIn],
        responses={
            200: LogOut,
            503: OpenApiResponse(description="`unavailable`: the cluster cannot be read from now."),
        },
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def log(self, request, pk=None):
        """The last `tail` lines (≤ 5000) of the job's output."""
        job = self.get_object()
        query = LogIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        tail = services.job_log_tail(job=job, lines=query.validated_data["tail"])
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
            if t.scenario == (request.query_params.get("scenario") or t.scenario)  # empty: all
        ]
        return Response({"next": None, "previous": None, "results": TemplateOut(rows, many=True).data})


class Usage(APIView):
    """GPU-hours and their cost by day, user, GPU model, tenant, scenario or cluster, over a date
    range: running jobs so far, each run's GPU-hours on the days it ran."""

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
        results = [row | {"cost": money.as_api(row["cost"])} for row in rows]
        return Response({"currency": money.currency(), "results": results})


class _StreamView(APIView):
    """An SSE stream (jobs/stream.py). Its refusals are problem+json whatever Accept asks, since
    an EventSource asks for text/event-stream; the stream itself is not rendered by DRF."""

    def perform_content_negotiation(self, request, force=False):
        return JSONRenderer(), JSONRenderer.media_type


LAST_EVENT_ID = OpenApiParameter(
    "Last-Event-ID",
    {"type": "string", "pattern": "^[0-9]{1,18}$"},
    OpenApiParameter.HEADER,
    description="The id of the last event received: the stream starts after it.",
)
EVENT_STREAM = {
    (200, "text/event-stream"): OpenApiResponse(
        OpenApiTypes.STR, description="Server-Sent Events (docs/api.md, Live events)."
    ),
}


class EventStream(_StreamView):
    """The job events of the caller's tenants (of one, with `tenant`), as Server-Sent Events."""

    @extend_schema(
        parameters=[OpenApiParameter("tenant", OpenApiTypes.STR), LAST_EVENT_ID],
        responses={**EVENT_STREAM, 404: OpenApiResponse(description="`not_found`: not the caller's tenant.")},
    )
    def get(self, request):
        watch = stream.watch_of(request.user, request.query_params.get("tenant") or None)
        return stream.job_events_stream(request, watch, _last_event_id(request))


def _last_event_id(request) -> int | None:
    value = request.headers.get("Last-Event-ID", "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise ValidationError({"Last-Event-ID": ["An event id: digits, as the stream sent it."]})
    return int(value)


class JobLogStream(_StreamView):
    """One job's new log lines and state changes as Server-Sent Events, until the job ends."""

    @extend_schema(responses=EVENT_STREAM)
    def get(self, request, pk):
        job = jobs_visible_to(user=request.user).filter(pk=pk).first()
        if job is None:
            raise NotFound
        return stream.job_log_stream(request, job)


# --- A tenant's lending (docs/api.md, Lending between tenants)


class TenantLendingViewSet(ReadByMembers):
    """What the tenant lends and borrows in its cohorts, now and by day. Every member of the tenant
    reads it; no other tenant is named."""

    serializer_class = LendingOut

    @extend_schema(parameters=[LendingIn], responses=LendingOut)
    def retrieve(self, request, tenant_slug=None):
        tenant = self.tenant()  # 404 before the query is read
        query = LendingIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(lending_of(tenant=tenant, days=query.validated_data["days"]))


class TenantLoanViewSet(mixins.ListModelMixin, ReadByMembers):
    """The tenant's loans, lent and borrowed, newest first. The other tenant of a loan is named
    (`counterpart`) to staff who see every tenant only, and the borrowing job only to its own
    tenant: a lender learns how many GPUs went, and when, not to whom."""

    serializer_class = LoanOut
    queryset = Loan.objects.none()
    filterset_class = LoanFilter

    def get_queryset(self):
        return loans_of(user=self.request.user, tenant=self.tenant())  # 404 before a filter is read


# --- A tenant's budgets (docs/api.md, Budgets)


class TenantBudgetViewSet(ReadByMembers):
    """The tenant's budgets with what each has spent and holds in reserve: every member of the
    tenant reads them, and staff who see every tenant; its owners, managers and platform admins
    set, change and remove them (403 for other roles, after the 404 of another tenant, before
    the body is read)."""

    serializer_class = BudgetOut
    queryset = Budget.objects.none()
    lookup_value_regex = ID_LOOKUP
    # One page (a monthly budget and one per grant at most), in the list's shape: no cursor and
    # no page size to take, none to document.
    pagination_class = None
    filter_backends = []

    def keeper(self):
        tenant = self.tenant()
        require(self.request.user, tenant, roles.MANAGE_MEMBERS)
        return tenant

    def one(self, tenant, pk):
        budget = budget_of(tenant=tenant, budget_id=int(pk))
        if budget is None:
            raise NotFound
        return budget

    @extend_schema(responses=BudgetPageOut)
    def overview(self, request, tenant_slug=None):
        """Every budget of the tenant with its figures, on one page (the list's shape)."""
        rows = BudgetOut(budgets_of(tenant=self.tenant()), many=True).data
        return Response({"next": None, "previous": None, "results": rows})

    @extend_schema(request=BudgetIn, responses={201: BudgetOut})
    def create(self, request, tenant_slug=None):
        tenant = self.keeper()
        data = parsed(BudgetIn, request)
        grant = data.pop("grant")
        budget = budget_create(
            actor=request.user, tenant=tenant, grant_id=int(grant) if grant else None, **data
        )
        return Response(BudgetOut(budget_status(budget=budget)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=BudgetPatch, responses={200: BudgetOut})
    def partial_update(self, request, tenant_slug=None, pk=None):
        tenant = self.keeper()
        budget = self.one(tenant, pk)
        data = parsed(BudgetPatch, request)
        budget = budget_change(actor=request.user, budget=budget, **data)
        return Response(BudgetOut(budget_status(budget=budget)).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, tenant_slug=None, pk=None):
        tenant = self.keeper()
        budget_delete(actor=request.user, budget=self.one(tenant, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
