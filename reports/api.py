"""The API of statements, the site report and the TCO view (docs/api.md, Cost)."""

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.core.parsing import parsed
from portal.core.renderers import JSONRenderer
from portal.core.serializers import ID_LOOKUP
from reports.exports import XLSX_TYPE, csv_bytes, download, xlsx_bytes
from reports.filters import StatementFilter
from reports.models import Statement, TcoProfile
from reports.pdf import LANGUAGES, statement_pdf
from reports.selectors import statement_lines, statement_summaries, statements_visible_to
from reports.serializers import (
    SiteReportCsvIn,
    SiteReportIn,
    SiteReportOut,
    StatementDetailOut,
    StatementDownloadIn,
    StatementIn,
    StatementOut,
    TcoProfileIn,
    TcoProfileOut,
    TcoQuery,
)
from reports.site import site_report_of, site_report_tables
from reports.statements import statement_csv, statement_filename, statement_make, statement_xlsx
from reports.tco_profiles import (
    figures_of,
    tco_profile_change,
    tco_profile_create,
    tco_profile_delete,
    tco_profiles_visible_to,
)
from tenants.permissions import require_platform_admin, require_staff_reader

# --- Statements


class StatementFileRenderer(BaseRenderer):
    """A statement's file as its view wrote it; an error's problem as JSON."""

    charset = None
    render_style = "binary"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, bytes):
            return data
        return JSONRenderer().render(data)


class PdfRenderer(StatementFileRenderer):
    media_type, format = "application/pdf", "pdf"


class CsvRenderer(StatementFileRenderer):
    media_type, format = "text/csv", "csv"


class XlsxRenderer(StatementFileRenderer):
    media_type, format = XLSX_TYPE, "xlsx"


def _binary(media_type: str) -> dict:
    return {(200, media_type): OpenApiResponse(OpenApiTypes.BINARY, description="The file, an attachment.")}


class StatementViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Monthly statements: members of a tenant (any role) and staff who see every tenant read
    them; platform admins make one for a month that has ended. Another tenant's: 404."""

    serializer_class = StatementOut
    queryset = Statement.objects.none()
    filterset_class = StatementFilter
    lookup_value_regex = ID_LOOKUP

    def get_queryset(self):
        return statements_visible_to(user=self.request.user)

    def one(self, pk) -> Statement:
        return get_object_or_404(self.get_queryset(), pk=int(pk))

    @extend_schema(responses=StatementDetailOut)
    def retrieve(self, request, pk=None):
        statement = self.one(pk)
        context = {
            "summaries": statement_summaries(statement=statement),
            "lines": statement_lines(statement=statement),
        }
        return Response(StatementDetailOut(statement, context=context).data)

    @extend_schema(request=StatementIn, responses={200: StatementOut, 201: StatementOut})
    def create(self, request):
        """Make the tenant's statement of a month that has ended (platform admins): 201 when made
        now, 200 with the one made before (it never changes)."""
        require_platform_admin(request.user)
        data = parsed(StatementIn, request)
        statement, made = statement_make(tenant=data["tenant"], month=data["month"])
        code = status.HTTP_201_CREATED if made else status.HTTP_200_OK
        return Response(StatementOut(statement).data, status=code)

    def language(self, request) -> str:
        query = StatementDownloadIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        asked = query.validated_data.get("lang") or getattr(request, "LANGUAGE_CODE", "")
        return asked if asked in LANGUAGES else "en"

    @extend_schema(parameters=[StatementDownloadIn], responses=_binary("application/pdf"))
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, PdfRenderer])
    def pdf(self, request, pk=None):
        """The statement as a PDF in `lang` (else the request's language), with its charts."""
        statement = self.one(pk)
        language = self.language(request)
        content = statement_pdf(statement, language=language)
        response = HttpResponse(content, content_type="application/pdf")
        name = f"{statement_filename(statement)}-{language}.pdf"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    @extend_schema(responses=_binary("text/csv"))
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, CsvRenderer])
    def csv(self, request, pk=None):
        """The statement's lines as CSV (UTF-8 with a byte order mark)."""
        statement = self.one(pk)
        return download(statement_csv(statement), filename=statement_filename(statement), fmt="csv")

    @extend_schema(responses=_binary(XLSX_TYPE))
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, XlsxRenderer])
    def xlsx(self, request, pk=None):
        """The statement as a workbook: its totals, lines and sums by GPU model, scenario, user."""
        statement = self.one(pk)
        return download(statement_xlsx(statement), filename=statement_filename(statement), fmt="xlsx")


# --- Site report


def _site_report(request, query_class) -> tuple[dict, object]:
    """403 for anyone but staff who see every tenant, then 400 for the query, then the report."""
    require_staff_reader(request.user)
    query = query_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    data = query.validated_data
    report = site_report_of(user=request.user, start=data["from"], end=data["to"], top=data["top"])
    return data, report


class FileNegotiation(BaseContentNegotiation):
    """A download is its file whatever `Accept` or `?format=` ask (a `?format=` the file is not
    would otherwise be DRF's 404); an error is problem+json all the same (portal/core/errors.py)."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[-1], renderers[-1].media_type


NO_FORMAT = OpenApiParameter("format", exclude=True)


def _site_filename(data: dict) -> str:
    return f"site-report-{data['from']:%Y%m%d}-{data['to']:%Y%m%d}"


class SiteReportView(APIView):
    """Usage and cost by tenant, GPU model, scenario, cluster, partition and day; utilization by
    partition and day; waits to the first start by scenario and tier; the top consumers."""

    schema_forbids_reads = True

    @extend_schema(parameters=[SiteReportIn], responses=SiteReportOut)
    def get(self, request):
        _, report = _site_report(request, SiteReportIn)
        return Response(SiteReportOut(report).data)


class SiteReportCsv(APIView):
    """One table of the site report as CSV (UTF-8 with a byte order mark)."""

    renderer_classes = [JSONRenderer, CsvRenderer]
    content_negotiation_class = FileNegotiation
    schema_forbids_reads = True

    @extend_schema(parameters=[SiteReportCsvIn, NO_FORMAT], responses=_binary("text/csv"))
    def get(self, request):
        data, report = _site_report(request, SiteReportCsvIn)
        headers, rows = site_report_tables(report)[data["table"]]
        name = f"{_site_filename(data)}-{data['table']}"
        return download(csv_bytes(headers, rows), filename=name, fmt="csv")


class SiteReportXlsx(APIView):
    """The site report as a workbook, a sheet per table."""

    renderer_classes = [JSONRenderer, XlsxRenderer]
    content_negotiation_class = FileNegotiation
    schema_forbids_reads = True

    @extend_schema(parameters=[SiteReportIn, NO_FORMAT], responses=_binary(XLSX_TYPE))
    def get(self, request):
        data, report = _site_report(request, SiteReportIn)
        content = xlsx_bytes(site_report_tables(report))
        return download(content, filename=_site_filename(data), fmt="xlsx")


# --- TCO


class TcoViewSet(viewsets.GenericViewSet):
    """TCO profiles and their figures: platform admins only (403 for anyone else)."""

    queryset = TcoProfile.objects.none()
    serializer_class = TcoProfileOut
    lookup_value_regex = ID_LOOKUP
    schema_forbids_reads = True

    def get_queryset(self):
        require_platform_admin(self.request.user)
        return tco_profiles_visible_to(user=self.request.user)

    def figures(self, profiles) -> list:
        query = TcoQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return figures_of(list(profiles), utilization=query.validated_data.get("utilization"))

    def one(self, pk) -> TcoProfile:
        return get_object_or_404(self.get_queryset(), pk=int(pk))

    @extend_schema(parameters=[TcoQuery])
    def list(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TcoProfileOut(self.figures(page), many=True).data)

    @extend_schema(parameters=[TcoQuery])
    def retrieve(self, request, pk=None):
        return Response(TcoProfileOut(self.figures([self.one(pk)])[0]).data)

    @extend_schema(request=TcoProfileIn, responses={201: TcoProfileOut})
    def create(self, request):
        require_platform_admin(request.user)
        profile = tco_profile_create(actor=request.user, **parsed(TcoProfileIn, request))
        profile = self.one(profile.pk)
        return Response(TcoProfileOut(self.figures([profile])[0]).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TcoProfileIn, responses=TcoProfileOut)
    def partial_update(self, request, pk=None):
        profile = self.one(pk)
        data = parsed(TcoProfileIn, request, partial=True)
        tco_profile_change(actor=request.user, profile=profile, **data)
        return Response(TcoProfileOut(self.figures([self.one(pk)])[0]).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        tco_profile_delete(actor=request.user, profile=self.one(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
