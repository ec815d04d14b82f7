"""Bad input on every write of tenants and quota answers 4xx problem+json naming the field."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.api_support import assert_problem, request_body

pytestmark = pytest.mark.django_db

TODAY = timezone.localdate()

QUOTA_CASES = [
    ({"gpus": "eight"}, "gpus"),
    ({"gpus": 0}, "gpus"),
    ({"gpus": -4}, "gpus"),
    ({"gpus": 10**12}, "gpus"),
    ({"gpu_hours": -1}, "gpu_hours"),
    ({"gpu_hours": 0}, "gpu_hours"),
    ({"gpu_hours": "lots"}, "gpu_hours"),
    ({"gpu_hours": 1e300}, "gpu_hours"),
    ({"starts_on": "yesterday"}, "starts_on"),
    ({"ends_on": str(TODAY - timedelta(days=1)), "starts_on": str(TODAY)}, "ends_on"),
    ({"ends_on": "2026-02-30"}, "ends_on"),
    ({"scenario": "astrology"}, "scenario"),
    ({"gpu_model": "h9000"}, "gpu_model"),
    ({"tenant": ["protein-lab"]}, "tenant"),
    ({"justification": ""}, "justification"),
    ({"justification": None}, "justification"),
]


@pytest.mark.parametrize(("change", "field"), QUOTA_CASES)
def test_quota_request_names_the_bad_field(client_for, owner, catalog, change, field):
    response = client_for(owner).post("/api/v1/quota-requests/", request_body(**change), format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert field in response.json()["errors"]


def test_a_body_that_is_not_an_object_is_400(client_for, owner, catalog):
    response = client_for(owner).post("/api/v1/quota-requests/", [1, 2, 3], format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"


def test_a_ten_megabyte_body_is_refused_with_a_problem(client_for, owner, catalog):
    huge = json.dumps(request_body(justification="x" * 10_000_000))
    response = client_for(owner).generic(
        "POST", "/api/v1/quota-requests/", huge, content_type="application/json"
    )
    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "invalid"


@pytest.mark.parametrize(
    ("url", "method", "body", "field"),
    [
        ("/api/v1/tenants/", "post", {"slug": "Bad Slug!", "name": "x"}, "slug"),
        ("/api/v1/tenants/", "post", {"slug": "default", "name": "x"}, "slug"),  # a namespace of Kubernetes'
        ("/api/v1/tenants/", "post", {"slug": "kube-system", "name": "x"}, "slug"),
        ("/api/v1/tenants/", "post", {"slug": "ok", "name": "x", "tier": "platinum"}, "tier"),
        (
            "/api/v1/tenants/",
            "post",
            {"slug": "ok", "name": "x", "contact_email": "not-mail"},
            "contact_email",
        ),
        ("/api/v1/tenants/", "post", {"slug": "ok", "name": "x", "owner": "ghost"}, "owner"),
        ("/api/v1/tenants/protein-lab/", "patch", {"state": "deleted"}, "state"),
        ("/api/v1/tenants/protein-lab/", "patch", {"name": ""}, "name"),
        ("/api/v1/tenants/protein-lab/members/", "post", {"username": "owner", "role": "god"}, "role"),
        ("/api/v1/tenants/protein-lab/members/", "post", {"role": "viewer"}, "username"),
        ("/api/v1/tenants/protein-lab/members/owner/", "patch", {"role": 7}, "role"),
        # once a 500 each: an address longer than the column, a slug that is no slug
        (
            "/api/v1/tenants/protein-lab/",
            "patch",
            {"contact_email": "a" * 250 + "@example.org"},
            "contact_email",
        ),
        ("/api/v1/tenants/", "post", {"slug": "Team_A", "name": "A"}, "slug"),
    ],
)
def test_tenant_and_member_writes_name_the_bad_field(client_for, admin_user, owner, url, method, body, field):
    response = getattr(client_for(admin_user), method)(url, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "note"), ({"note": "ok", "gpus": 0}, "gpus"), ({"note": "ok", "gpu_hours": "x"}, "gpu_hours"),
     ({"note": "ok", "ends_on": "soon"}, "ends_on"), ({"note": "ok", "ends_on": str(TODAY - timedelta(days=3))}, "ends_on")],
)  # fmt: skip
def test_decisions_name_the_bad_field(client_for, admin_user, owner, catalog, body, field):
    request_id = client_for(owner).post("/api/v1/quota-requests/", request_body()).json()["id"]
    response = client_for(admin_user).post(
        f"/api/v1/quota-requests/{request_id}/approve/", body, format="json"
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


def test_a_non_numeric_id_is_404_not_500(client_for, owner):
    assert client_for(owner).get("/api/v1/quota-requests/abc/").status_code == 404
    assert client_for(owner).get("/api/v1/quotas/99999999999999999999/").status_code == 404


# PostgreSQL refuses a NUL byte in a text parameter (psycopg raises DataError, not ValueError).
@pytest.mark.parametrize("method", ["patch", "delete"])
def test_a_nul_byte_as_a_members_name_is_404(client_for, owner, method):
    response = getattr(client_for(owner), method)(
        "/api/v1/tenants/protein-lab/members/a%00b/", {"role": "viewer"}, format="json"
    )
    assert_problem(response, 404, "not_found")


def test_a_new_tenants_owner_with_a_nul_byte_is_400(client_for, admin_user):
    body = {"slug": "new-team", "name": "New", "owner": "ad\x00min"}
    response = client_for(admin_user).post("/api/v1/tenants/", body, format="json")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["owner"]


@pytest.mark.parametrize(
    ("change", "field"), [({"name": 0}, "name"), ({"contact_email": True}, "contact_email")]
)
def test_a_string_field_refuses_another_json_type(client_for, owner, change, field):
    # DRF's CharField reads 0 as "0".
    response = client_for(owner).patch("/api/v1/tenants/protein-lab/", change, format="json")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == [field]


@pytest.mark.parametrize(
    ("change", "field"),
    [({"gpus": "8"}, "gpus"), ({"gpus": True}, "gpus"), ({"gpu_hours": "5"}, "gpu_hours")],
)
def test_a_number_field_refuses_a_string(client_for, owner, catalog, change, field):
    response = client_for(owner).post("/api/v1/quota-requests/", request_body(**change), format="json")
    assert field in assert_problem(response, 400, "invalid")["errors"]
