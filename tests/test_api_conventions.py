"""API.md, Conventions: problem+json errors, cursor pagination, throttles."""

import pytest
from django.test import override_settings

from portal.core.services import token_create

pytestmark = pytest.mark.django_db

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith(code)
    return body


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
    """API.md: no auth → 401, as problem+json whatever the view's own renderer (YAML, HTML)."""
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
