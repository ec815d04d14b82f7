"""The statements API: who reads and who makes them, the detail's sums, and the PDF (its text
extracted in each language), CSV and XLSX downloads."""

import csv
import io
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from openpyxl import load_workbook
from pypdf import PdfReader

from reports.models import Statement
from reports.pdf import refuse_fetch
from reports.statements import statement_make
from tests.api_support import assert_problem
from tests.statements_support import MARCH, at, make_march

pytestmark = pytest.mark.django_db


@pytest.fixture
def statement(tenant, catalog, make_job):
    make_march(tenant, catalog[1], make_job)
    made, _ = statement_make(tenant=tenant, month=MARCH, now=at(2, 0, month=4))
    return made


def test_every_member_reads_the_statement_with_its_sums(client_for, viewer, statement):
    answer = client_for(viewer).get(f"/api/v1/statements/{statement.pk}/")
    assert answer.status_code == 200
    body = answer.json()
    assert (body["tenant"], body["month"], body["currency"]) == ("protein-lab", "2025-03", "CNY")
    assert (body["cost"], body["cost_exact"], body["totals"]["cost"]) == ("615.12", "615.125", "615.12")
    assert body["gpu_hours"] == "54.0100" and body["jobs"] == 4
    assert {row["key"]: row["cost"] for row in body["by_user"]} == {"alice": "540.12", "bob": "75.00"}
    assert body["by_gpu_model"][0]["key"] == "h100-80gb" and body["by_scenario"][0]["jobs"] == 4
    assert sum(Decimal(line["cost_exact"]) for line in body["lines"]) == Decimal("615.125")


def test_the_list_filters_by_tenant_and_month(client_for, member, statement):
    client = client_for(member)
    assert [
        row["id"]
        for row in client.get("/api/v1/statements/?tenant=protein-lab&month=2025-03").json()["results"]
    ] == [statement.pk]
    assert client.get("/api/v1/statements/?month=2025-04").json()["results"] == []
    assert_problem(client.get("/api/v1/statements/?month=2025-13"), 400, "invalid")


def test_another_tenants_statement_is_404_everywhere(client_for, outsider, statement):
    client = client_for(outsider)
    assert client.get("/api/v1/statements/").json()["results"] == []
    for tail in ("", "pdf/", "csv/", "xlsx/"):
        assert_problem(client.get(f"/api/v1/statements/{statement.pk}/{tail}"), 404, "not_found")


def test_staff_who_see_every_tenant_read_it(client_for, admin_user, statement):
    assert client_for(admin_user).get(f"/api/v1/statements/{statement.pk}/").status_code == 200


def test_only_platform_admins_make_one_200_when_it_exists(client_for, owner, admin_user, statement, tenant):
    body = {"tenant": "protein-lab", "month": "2025-03"}
    assert_problem(
        client_for(owner).post("/api/v1/statements/", body, format="json"), 403, "permission_denied"
    )
    again = client_for(admin_user).post("/api/v1/statements/", body, format="json")
    assert again.status_code == 200 and again.json()["id"] == statement.pk
    made = client_for(admin_user).post("/api/v1/statements/", {**body, "month": "2025-02"}, format="json")
    assert made.status_code == 201 and made.json()["cost"] == "20.00"  # the February job
    future = client_for(admin_user).post("/api/v1/statements/", {**body, "month": "2999-01"}, format="json")
    assert_problem(future, 400, "invalid")
    for month in ("0000-01", "1999-12", "2025-00"):  # outside the years 2000–2999, or no month
        bad = client_for(admin_user).post("/api/v1/statements/", {**body, "month": month}, format="json")
        assert list(assert_problem(bad, 400, "invalid")["errors"]) == ["month"]
    assert Statement.objects.count() == 2


def pdf_text(content: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(content)).pages)


@pytest.mark.parametrize(("lang", "total"), [("en", "CN¥615.12"), ("zh-hans", "¥615.12")])
def test_the_pdf_shows_the_tenant_and_the_total_in_each_language(client_for, member, statement, lang, total):
    answer = client_for(member).get(f"/api/v1/statements/{statement.pk}/pdf/?lang={lang}")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/pdf"
    assert answer["Content-Disposition"] == f'attachment; filename="statement-protein-lab-2025-03-{lang}.pdf"'
    text = pdf_text(answer.content)
    assert statement.tenant_name in text and total in text
    assert "CN¥" not in text if lang == "zh-hans" else "CN¥540.12" in text  # the chart's and table's bars
    assert "alice" in text and "bob" in text and "2025-03" in text


def test_a_bad_language_is_400(client_for, member, statement):
    assert_problem(client_for(member).get(f"/api/v1/statements/{statement.pk}/pdf/?lang=fr"), 400, "invalid")


def test_the_csv_has_every_line_exact_and_rounded(client_for, member, statement):
    answer = client_for(member).get(f"/api/v1/statements/{statement.pk}/csv/")
    assert answer.status_code == 200
    assert answer["Content-Disposition"] == 'attachment; filename="statement-protein-lab-2025-03.csv"'
    assert answer.content.startswith("\ufeff".encode())
    rows = list(csv.DictReader(io.StringIO(answer.content.decode("utf-8-sig"))))
    assert len(rows) == statement.lines.count() == 5
    assert sum(Decimal(row["cost_exact"]) for row in rows) == Decimal("615.125")
    tiny = next(row for row in rows if row["job_name"] == "tiny")
    assert (tiny["cost"], tiny["cost_exact"]) == ("0.12", "0.125")


def test_the_xlsx_has_the_totals_lines_and_sums(client_for, member, statement):
    answer = client_for(member).get(f"/api/v1/statements/{statement.pk}/xlsx/")
    assert answer.status_code == 200
    book = load_workbook(io.BytesIO(answer.content))
    assert book.sheetnames == ["Statement", "Lines", "By GPU model", "By scenario", "By user"]
    header, total = list(book["Statement"].values)
    assert dict(zip(header, total, strict=True))["cost_exact"] == "615.125"
    assert len(list(book["Lines"].values)) == 1 + 5
    by_user = {row[0]: row[5] for row in list(book["By user"].values)[1:]}
    assert by_user == {"alice": "540.125", "bob": "75"}


def test_the_list_costs_the_same_queries_for_1_and_20_statements(client_for, member, tenant):
    client = client_for(member)
    client.get("/api/v1/me/")

    def count(n):
        for i in range(Statement.objects.count(), n):
            statement_make(tenant=tenant, month=MARCH.replace(year=2000 + i), now=at(2, 0, month=4))
        with CaptureQueriesContext(connection) as queries:
            assert len(client.get("/api/v1/statements/").json()["results"]) == n
        return len(queries)

    assert count(1) == count(20)


def test_a_name_that_looks_like_markup_is_text_in_the_pdf_and_fetches_nothing(
    client_for, member, tenant, catalog
):
    tenant.name = '<img src="file:///etc/hostname"> Lab'
    tenant.save()
    made, _ = statement_make(tenant=tenant, month=MARCH, now=at(2, 0, month=4))
    response = client_for(member).get(f"/api/v1/statements/{made.pk}/pdf/?lang=en")
    assert response.status_code == 200
    assert '<img src="file:///etc/hostname"> Lab' in pdf_text(response.content)
    with pytest.raises(ValueError, match="fetches nothing"):
        refuse_fetch("file:///etc/hostname")


def test_a_long_statement_lists_its_first_lines_in_the_pdf_and_says_where_the_rest_are(
    client_for, member, statement, monkeypatch
):
    monkeypatch.setattr("reports.pdf.PDF_LINES", 2)  # March has 5 lines
    text = pdf_text(client_for(member).get(f"/api/v1/statements/{statement.pk}/pdf/?lang=en").content)
    assert "The first 2 lines are shown here; 3 more are in the statement's CSV and XLSX" in " ".join(
        text.split()
    )
    assert "CN¥615.12" in text  # the totals are every line's
