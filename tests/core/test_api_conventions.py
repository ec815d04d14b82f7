"""docs/api.md, Conventions: problem+json errors, cursor pagination, throttles; odd input on any
endpoint (a NUL byte, a forged cursor) is a 4xx, never a 500; and the schema describes every
answer (what schemathesis, scripts/fuzz, found and holds the API to)."""

from base64 import b64encode

import pytest
from django.test import override_settings
from rest_framework.exceptions import NotFound as DrfNotFound

from portal.core.errors import NotFound, problem_exception_handler
from portal.core.tokens import token_create
from tests.api_support import assert_problem, request_body
from tests.jobs_support import JOB

pytestmark = pytest.mark.django_db


def test_no_credentials_is_401(anon_client):
    assert_problem(anon_client.get("/api/v1/auth/tokens/"), 401, "not_authenticated")


def test_wrong_method_is_405(client_for, member):
    assert_problem(client_for(member).put("/api/v1/me/", {}), 405, "method_not_allowed")


def test_unknown_api_path_is_a_problem_404(client_for, member):
    assert_problem(client_for(member).get("/api/v1/no-such-thing/"), 404, "not_found")


def test_malformed_json_is_400(client_for, member):
    response = client_for(member).generic(
        "POST", "/api/v1/auth/token/", "{not json", content_type="application/json"
    )
    assert_problem(response, 400, "invalid")


def test_unsupported_media_type_is_invalid(anon_client, db):
    response = anon_client.generic("POST", "/api/v1/auth/token/", "username=a", content_type="text/plain")
    assert_problem(response, 415, "invalid")


@pytest.mark.urls("tests.urls_errors")
def test_unhandled_error_is_a_500_problem_without_internals(client_for, member, caplog):
    response = client_for(member).get("/api/v1/boom/")
    body = assert_problem(response, 500, "server_error")
    assert "hunter2" not in response.content.decode()
    assert "RuntimeError" not in body["detail"]
    assert any("unhandled error" in record.message for record in caplog.records)


def test_lists_are_cursor_paginated(client_for, member):
    client = client_for(member)
    for n in range(4):
        token_create(user=member, name=f"t{n}")
    first = client.get("/api/v1/auth/tokens/?page_size=2").json()
    assert set(first) == {"next", "previous", "results"}
    assert len(first["results"]) == 2 and first["previous"] is None
    second = client.get(first["next"]).json()
    third = client.get(second["next"]).json()
    seen = [t["id"] for page in (first, second, third) for t in page["results"]]
    assert len(seen) == 5 == len(set(seen))
    assert third["next"] is None


@pytest.mark.parametrize("page_size", ["0", "201", "ten", "-1"])
def test_bad_page_size_is_400_naming_it(client_for, member, page_size):
    body = assert_problem(
        client_for(member).get(f"/api/v1/auth/tokens/?page_size={page_size}"), 400, "invalid"
    )
    assert list(body["errors"]) == ["page_size"]


def test_bad_cursor_is_400_naming_it(client_for, member):
    body = assert_problem(client_for(member).get("/api/v1/auth/tokens/?cursor=garbage"), 400, "invalid")
    assert list(body["errors"]) == ["cursor"]


def test_user_throttle_answers_429_with_retry_after(client_for, member, owner):
    client = client_for(member)
    with override_settings(API_THROTTLE_RATES={"user": "3/min", "anon": "100/min", "token": "100/min"}):
        for _ in range(3):
            assert client.get("/api/v1/me/").status_code == 200
        body = assert_problem(client.get("/api/v1/me/"), 429, "throttled")
        response = client.get("/api/v1/me/")
        assert 1 <= int(response["Retry-After"]) <= 60
        assert body["retry_after_s"] >= 1
        # Per user: another caller is not held back by this one.
        assert client_for(owner).get("/api/v1/me/").status_code == 200


def test_token_endpoint_throttles_password_guessing(anon_client, member):
    with override_settings(API_THROTTLE_RATES={"user": "100/min", "anon": "100/min", "token": "2/min"}):
        for _ in range(2):
            assert (
                anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "x"}).status_code
                == 400
            )
        assert_problem(
            anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "x"}), 429, "throttled"
        )


def test_schema_and_docs_are_served_to_a_caller_with_credentials(client_for, member, web):
    schema = client_for(member).get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    spec = schema.json()
    assert spec["openapi"].startswith("3.")
    assert "/api/v1/me/" in spec["paths"]
    assert spec["components"]["securitySchemes"]["tokenAuth"]["name"] == "Authorization"
    docs = web(member).get("/api/v1/docs/")  # a browser's session, as the page is opened
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content


@pytest.mark.parametrize("url", ["/api/v1/schema/", "/api/v1/schema/?format=json", "/api/v1/docs/"])
def test_schema_and_docs_answer_401_without_credentials(anon_client, db, url):
    """docs/api.md: no auth → 401, as problem+json whatever the view's own renderer (YAML, HTML)."""
    response = anon_client.get(url, HTTP_ACCEPT="text/html,application/yaml,*/*")
    assert_problem(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Token"


def test_schema_validates_without_warnings():
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


# PostgreSQL refuses a NUL byte in a text parameter (psycopg raises DataError, not ValueError).
@pytest.mark.parametrize("kind", ["tenants", "gpu-models", "scenarios", "clusters", "jobs", "quotas"])
def test_a_nul_byte_as_an_objects_name_is_404(client_for, member, kind):
    assert_problem(client_for(member).get(f"/api/v1/{kind}/a%00b/"), 404, "not_found")


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/jobs/", JOB | {"tenant": "\x00"}, "tenant"),
        ("/api/v1/jobs/", JOB | {"scenario": "ai\x00"}, "scenario"),
        ("/api/v1/jobs/", JOB | {"gpu_model": "\x00"}, "gpu_model"),
        ("/api/v1/jobs/", JOB | {"cluster": "\x00"}, "cluster"),
        ("/api/v1/quota-requests/", request_body(tenant="protein\x00lab"), "tenant"),
        ("/api/v1/tenants/protein-lab/members/", {"username": "\x00", "role": "viewer"}, "username"),
    ],
)
def test_a_nul_byte_in_a_reference_is_400_naming_it(client_for, owner, catalog, url, body, field):
    body = assert_problem(client_for(owner).post(url, body, format="json"), 400, "invalid")
    assert field in body["errors"]


@pytest.mark.parametrize(
    "url", ["/api/v1/audit/?action=a%00", "/api/v1/jobs/?tenant=%00", "/api/v1/usage/?tenant=%00"]
)
def test_a_nul_byte_in_a_text_filter_is_400_as_the_schema_says(client_for, owner, url):
    assert_problem(client_for(owner).get(url), 400, "invalid")


def test_a_page_size_of_other_digits_is_400(client_for, member):
    # "²".isdigit() holds, and int("²") raises: the check was isdigit().
    body = assert_problem(client_for(member).get("/api/v1/auth/tokens/?page_size=%C2%B2"), 400, "invalid")
    assert list(body["errors"]) == ["page_size"]


@pytest.mark.parametrize(
    "cursor",
    [
        "0.0.abc",  # a position an integer key cannot hold
        b64encode(b"p=abc").decode(),  # the same as DRF wrote cursors: its decoder took any text
        "0.0.1%00",
    ],
)
def test_a_forged_cursor_is_400(client_for, member, cursor):
    response = client_for(member).get(f"/api/v1/jobs/?cursor={cursor}")
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["cursor"]


def test_cursors_page_through_a_list_ordered_by_slug(client_for, member):
    client = client_for(member)
    first = client.get("/api/v1/gpu-models/?page_size=2").json()
    assert first["next"].split("cursor=")[1].startswith("0.0.")
    second = client.get(first["next"]).json()
    slugs = [g["slug"] for page in (first, second) for g in page["results"]]
    assert len(slugs) == 4 and slugs == sorted(slugs)
    back = client.get(second["previous"]).json()
    assert [g["slug"] for g in back["results"]] == slugs[:2]


def test_an_empty_page_size_or_cursor_reads_as_absent(client_for, member):
    client = client_for(member)
    response = client.get("/api/v1/gpu-models/?page_size=&cursor=")
    assert response.status_code == 200
    assert response.json() == client.get("/api/v1/gpu-models/").json()


def test_not_found_raised_by_a_service_is_a_404_problem():
    response = problem_exception_handler(NotFound("Gone meanwhile."), {})
    assert response.status_code == 404 and response.data["code"] == "not_found"


def test_a_404_without_text_still_says_what():
    # DRF raises a bare Http404 for a lookup value its field cannot hold.
    from django.http import Http404

    response = problem_exception_handler(Http404(), {})
    assert response.data["detail"] == "Not found."
    assert problem_exception_handler(DrfNotFound(), {}).data["detail"]


# --- What the schema says of every answer (schemathesis, scripts/fuzz, holds the API to it)


@pytest.fixture
def spec(client_for, member):
    return client_for(member).get("/api/v1/schema/?format=json").json()


def operations(spec):
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def test_every_error_answer_is_documented_as_problem_json(spec):
    for method, path, operation in operations(spec):
        responses = operation["responses"]
        where = f"{method} {path}"
        errors = {code: r for code, r in responses.items() if int(code) >= 400}
        for code, response in errors.items():
            assert list(response["content"]) == ["application/problem+json"], (where, code)
            assert response["content"]["application/problem+json"]["schema"]["$ref"].endswith("/ProblemOut")
        assert "429" in errors and "Retry-After" in errors["429"]["headers"], where
        secured = operation.get("security") and {} not in operation["security"]
        assert ("401" in errors) == bool(secured), where
        if any(p["in"] == "path" for p in operation.get("parameters", [])):
            assert "404" in errors, where
        if "requestBody" in operation:
            assert {"400", "413", "415"} <= set(errors), where


def test_the_schema_states_what_fields_the_api_refuses(spec):
    schemas = spec["components"]["schemas"]
    assert schemas["MemberPatchRequest"]["required"] == ["role"]  # not an all-optional PATCH body
    assert schemas["QuotaRequestOut"]["properties"]["decided_by"]["nullable"] is True
    assert {"type": "string", "maxLength": 0} in schemas["MeOut"]["properties"]["email"]["oneOf"]
    assert schemas["JobOut"]["properties"]["submitted_by"]["nullable"] is True
    assert schemas["QuotaRequestInRequest"]["properties"]["gpu_hours"]["multipleOf"] == 0.01
    assert "^(?!(?:default|root)$|kube-)" in schemas["TenantInRequest"]["properties"]["slug"]["pattern"]
    jobs = {p["name"]: p for p in spec["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert jobs["page_size"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 200}
    assert jobs["created_after"]["allowEmptyValue"] is True and "allowEmptyValue" not in jobs["state"]
    assert jobs["tenant"]["schema"]["pattern"] == "^[^\\x00]*$"  # a text filter refuses NUL, as said
    advise = spec["paths"]["/api/v1/scenarios/{slug}/advise/"]["post"]
    assert advise["requestBody"]["required"] is True
